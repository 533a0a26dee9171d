"""How koordctl reads koordd's state_dir: as koordd would trust it, bounded, checked, and escaped for a terminal.

- Trust: koordd refuses a state_dir that anyone but root (or its own user) could change
  (koordd/core/trust.py, koordd/runtime/host_claim.py): what is in it could be forged. koordctl refuses to read
  such a state_dir the same way, naming the directory or the file and why (exit 2).
- Bounds: a file larger than koordd writes (MAX_FILE; a decision log line longer than MAX_LINE), or with
  more objects and lists than any koordd writes, is refused before it is parsed; a document nested too deeply
  too. Every number is bounded by its shape (koordctl/shapes.py), so nothing sized from one can grow.
- Shape: each document is checked against what koordd writes before anything is shown: a file of another
  shape is one line naming the file and what is wrong (exit 2), never a traceback.
- Escaping: for the text views every string of a document, names of fields included, goes through
  printable() (and is cut at MAX_TEXT characters): no control character from a file reaches the terminal.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from koordctl.common import CtlError
from koordctl.shapes import Check, DECISION, Malformed, check
from koordd.act.decision_log import DecisionLog
from koordd.core.printable import printable
from koordd.core.trust import untrusted_state_dir
from koordd.runtime.host_claim import STATE_FILES

MAX_FILE = 16 << 20         # status.json and top.json are a few hundred KiB at 10,000 cgroups; a log is 8 MiB
MAX_CONTAINERS = 1 << 18    # objects and lists in one document: each costs Python ~100 bytes or more
MAX_LINE = 1 << 20          # one decision record
MAX_DEPTH = 64              # koordd's documents nest 7 deep at most
MAX_TEXT = 4096             # a string as shown (PATH_MAX): a longer one is cut, saying by how much
DECISION_FILES = tuple(f"{DecisionLog.FILE}.{i}" for i in range(3, 0, -1)) + (DecisionLog.FILE,)
CHECKED_FILES = tuple(dict.fromkeys(STATE_FILES + DECISION_FILES))


def refuse_untrusted(state_dir: Path) -> None:
    """CtlError unless koordd itself would trust `state_dir` and the files koordctl reads there."""
    if printable(str(state_dir)) != str(state_dir):     # a control character in a name the host lock gave
        raise CtlError(f"state_dir {printable(state_dir)}: a name with control characters: not koordd's")
    why = untrusted_state_dir(state_dir, CHECKED_FILES)
    if why:
        raise CtlError(f"{why}: koordd trusts its state_dir only if root alone can change it, and so does "
                       f"koordctl: what is in {state_dir} could be forged (chown root, chmod go-w)")


def bounded(path: Path, limit: int = MAX_FILE) -> None:
    """CtlError if the file is larger than `limit` (for files a reader of koordd's reads whole)."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return
    except OSError as e:
        raise CtlError(f"{path}: unreadable: {e.strerror or e}") from None
    if size > limit:
        raise CtlError(f"{path}: larger than {limit >> 20} MiB: not a file koordd writes")


def _read_bounded(path: Path, limit: int = MAX_FILE) -> bytes | None:
    """The file's bytes, None if it does not exist; CtlError if it cannot be read or is larger than `limit`."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CtlError(f"{path}: unreadable: {e.strerror or e}") from None
    if len(data) > limit:
        raise CtlError(f"{path}: larger than {limit >> 20} MiB: not a file koordd writes")
    return data


def parse(data: bytes | str, where: str) -> Any:
    """JSON, within MAX_CONTAINERS objects and lists and Python's nesting limit; CtlError naming `where`."""
    text = data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else data
    if text.count("{") + text.count("[") > MAX_CONTAINERS:
        raise CtlError(f"{where}: more than {MAX_CONTAINERS} objects and lists: not a file koordd writes")
    deep = CtlError(f"{where}: nested more than {MAX_DEPTH} deep: not a file koordd writes")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise deep from None
    except ValueError as e:
        raise CtlError(f"{where}: not JSON: {printable(e)}") from None
    if depth(doc) > MAX_DEPTH:
        raise deep
    return doc


def depth(doc: Any) -> int:
    """How deep lists and objects nest in `doc` (0 for a scalar), without recursion."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        value, d = todo.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, d)
        todo.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def read_document(path: Path, shape: Check) -> Any:
    """The parsed file if it has `shape`; None if it does not exist; CtlError naming the file otherwise.
    The caller has checked the state_dir (refuse_untrusted)."""
    data = _read_bounded(path)
    if data is None:
        return None
    doc = parse(data, str(path))
    try:
        check(doc, shape)
    except Malformed as e:
        raise CtlError(f"{path}: {printable(e)}: not what koordd writes") from None
    return doc


def read_records(state_dir: Path) -> Iterator[dict]:
    """Every decision record, oldest first, across rotated files. A line that is not JSON (a torn write) is
    skipped, as koordd/act/decision_log.py's reader skips it; a record of another shape is a CtlError
    naming its file and line."""
    for name in DECISION_FILES:
        path = Path(state_dir) / name
        data = _read_bounded(path)
        if data is None:
            continue
        for n, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            if len(line) > MAX_LINE:
                raise CtlError(f"{path}:{n}: a line of {len(line)} bytes: not a record koordd writes")
            try:
                record = json.loads(line.decode("utf-8", "replace"))
            except (ValueError, RecursionError):
                continue
            if depth(record) > MAX_DEPTH:
                raise CtlError(f"{path}:{n}: nested more than {MAX_DEPTH} deep: not a record koordd writes")
            try:
                check(record, DECISION)
            except Malformed as e:
                raise CtlError(f"{path}:{n}: {printable(e)}: not a record koordd writes") from None
            yield record


def escaped(value: Any) -> Any:
    """`value` with every string in it (keys too) made printable and at most MAX_TEXT characters long."""
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            value = f"{value[:MAX_TEXT]}... ({len(value) - MAX_TEXT} more characters)"
        return printable(value)
    if isinstance(value, dict):
        return {escaped(k): escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escaped(v) for v in value]
    return value
