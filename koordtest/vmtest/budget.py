"""tests/system/budget.txt: how long each system test takes, in seconds as measured on a development
machine, one line "SECONDS NODEID" per test (# comments)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUDGET_FILE = REPO / "tests" / "system" / "budget.txt"


def budgets(path: Path = BUDGET_FILE, strict: bool = True) -> dict[str, float]:
    """nodeid -> seconds. strict: a bad line is an error naming it (and a missing file an OSError);
    otherwise what cannot be read is left out."""
    try:
        text = path.read_text()
    except OSError:
        if strict:
            raise
        return {}
    out: dict[str, float] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            seconds, nodeid = line.split(None, 1)
            out[nodeid.strip()] = float(seconds)
        except ValueError:
            if strict:
                raise SystemExit(f"{path}:{n}: expected 'SECONDS NODEID', got {line!r}") from None
    return out
