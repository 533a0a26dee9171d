"""Unit tests of koordd.act."""
