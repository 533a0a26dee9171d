"""Unit tests of koordd.backends."""
