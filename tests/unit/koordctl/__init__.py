"""Unit tests of koordctl."""
