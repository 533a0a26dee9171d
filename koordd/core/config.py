"""The strict loader of koordd.toml (one file per node, default /etc/koordd/koordd.toml).

Every table and key is checked against a declared `Option` when the file loads:
a misspelt name, a wrong type or an out-of-range number is an error naming the
file, the line and the key, and every such error in the file is reported at
once, so one edit fixes them all and a bad file never reaches a loop.

The parts, each in its own module: the parse and where each key stands (toml_lines.py), the schema
and the check of the sections (config_check.py) and of the class rules (class_check.py), the checked values (settings.py), the class rules (class_rules.py)
and the overlap of their patterns (globs.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from koordd.core import toml_lines
from koordd.core.class_check import check_classes
from koordd.core.class_rules import ClassRule, rule_for
from koordd.core.config_check import METRICS_OPTIONS, TOP_LEVEL, Checker, check_daemon, check_loops, check_metrics, \
    check_report
from koordd.core.globs import nested_classes
from koordd.core.reclaimable import RECLAIMABLE_OPTIONS
from koordd.core.report import REPORT_OPTIONS
from koordd.core.settings import Settings, make_settings
from koordd.core.trust import untrusted

# Names other modules, tests and third parties' loops import from here.
from koordd.core.classes import CLASS_NAMES  # noqa: F401
from koordd.core.config_check import DAEMON_OPTIONS  # noqa: F401
from koordd.core.globs import can_hold  # noqa: F401
from koordd.core.settings import loop_options  # noqa: F401
from koordd.core.toml_lines import locate_keys  # noqa: F401

DEFAULT_PATH = Path("/etc/koordd/koordd.toml")


class ConfigError(Exception):
    """Everything wrong with one config file, one "<file>:<line>: <message>" per entry."""

    def __init__(self, errors: Iterable[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True)
class Config:
    path: Path
    daemon: Settings
    classes: tuple[ClassRule, ...]
    loops: Mapping[str, Settings]  # every registered loop; absent sections hold the defaults
    metrics: Settings = field(default_factory=lambda: make_settings(METRICS_OPTIONS, {}))
    reclaimable: Settings = field(default_factory=lambda: make_settings(RECLAIMABLE_OPTIONS, {}))
    report: Settings = field(default_factory=lambda: make_settings(REPORT_OPTIONS, {}))     # the node report
    # "<file>:<line>: warning: ..." for what is valid but likely not meant (koordctl validate prints
    # them, koordd logs them at start and reload): class roots nesting across BE (nested_classes).
    warnings: tuple[str, ...] = ()

    def rule_for(self, cgroup: str) -> ClassRule | None:
        """The first rule with a pattern matching `cgroup`, or None."""
        return rule_for(self.classes, cgroup)

    def classify(self, cgroup: str) -> str | None:
        """The class of the first rule with a matching pattern, or None (for tools and tests: the daemon
        matches a round's whole walk at once, ClassRules in class_rules.py)."""
        rule = self.rule_for(cgroup)
        return rule.name if rule else None


def load_config(path: Path | str, registry: Mapping[str, type]) -> Config:
    path = Path(path)
    why = untrusted(path)
    if why:
        raise ConfigError([f"{path}: refused: {why}; koordd runs as root and does what this file says, so "
                           f"only root may change it (chown root, chmod go-w), as sshd's StrictModes ask"])
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror or e}"]) from None
    except UnicodeDecodeError as e:  # TOML is UTF-8 by definition
        raise ConfigError([f"{path}: cannot read: not UTF-8 ({e.reason} at byte {e.start})"]) from None
    return parse_config(text, path, registry)


def parse_config(text: str, path: Path | str, registry: Mapping[str, type]) -> Config:
    path = Path(path)
    try:
        data = toml_lines.load(text, path)
    except toml_lines.TomlError as e:
        raise ConfigError([str(e)]) from None
    c = Checker(locate_keys(text))
    for key in data:
        if key not in TOP_LEVEL:
            c.unknown((key,), TOP_LEVEL, "table")
    daemon = check_daemon(c, data.get("daemon", {}))
    classes = check_classes(c, data.get("classes", []))
    loops = check_loops(c, data.get("loops", {}), registry)
    metrics = check_metrics(c, data.get("metrics", {}))
    reclaimable = c.top(RECLAIMABLE_OPTIONS, data.get("reclaimable", {}), "reclaimable")
    report = check_report(c, data.get("report", {}))
    if c.errors:
        # Stable sort: file order, with line-less errors (none today) first.
        raise ConfigError(f"{path}:{ln}: {msg}" if ln else f"{path}: {msg}"
                          for ln, msg in sorted(c.errors, key=lambda e: e[0] or 0))
    warnings = tuple(f"{path}:{toml_lines.line_of(c.lines, ('classes', i, 'cgroups'))}: warning: {msg}"
                     for i, msg in nested_classes(classes))
    return Config(path, daemon, classes, loops, metrics, reclaimable, warnings=warnings, report=report)
