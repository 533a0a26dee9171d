"""Unit tests of koordd.runtime."""
