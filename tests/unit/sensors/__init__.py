"""Unit tests of koordd.sensors."""
