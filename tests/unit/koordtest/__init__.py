"""Unit tests of koordtest (the benchmark and VM-test tooling) and of scripts/."""
