"""Unit tests of koordd.core."""
