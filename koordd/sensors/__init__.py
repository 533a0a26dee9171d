"""Sensors: each reads one part of the kernel and never raises for a missing or vanished source."""
