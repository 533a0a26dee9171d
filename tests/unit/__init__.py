"""Unit tests: fake trees and literal kernel text, no root. One folder per package of the code (tests/unit/COVERAGE.toml)."""
