"""Unit tests of koordd.kernel."""
