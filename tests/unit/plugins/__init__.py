"""Unit tests of the loops in plugins/ (package koordd_plugins)."""
