"""Names that workloads choose, made safe to print on one line of a terminal or a log.

A cgroup's or a process's name is the workload's to choose: it may hold a newline (a forged line of
koordctl's table or of the log), an escape sequence (the terminal obeys it), a bidi override, or bytes
that are not UTF-8 (Python reads them as surrogate escapes, which a UTF-8 stdout refuses). `printable`
writes every such character as a backslash escape, as Python would in a string literal: \\n, \\t, \\r,
\\x1b, \\u202e, and \\xff for the byte 0xff of a name that is not UTF-8. Everything else, a backslash
included, is left as it is: systemd names its cgroups with escapes of its own ("system-systemd\\x2dfsck.slice")
and they read as `ls` shows them. The stored records (the decision log, the restore journal, status
--json) keep the exact name; only what is shown to a person goes through here.
"""
from __future__ import annotations

import logging
import re
import unicodedata

# Controls (C0, DEL, C1), format characters (bidi overrides, zero-width), line and paragraph
# separators, surrogates: none of them belongs on a line as it is.
_UNSAFE_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_PLAIN = re.compile(r"[ -~]*")     # printable ASCII: the common case, no per-character work


def _escape(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:       # a byte that was not UTF-8, as os.fsdecode left it
        return f"\\x{n - 0xDC00:02x}"
    if n <= 0xFF:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"


def printable(text: object) -> str:
    """`text` (str() of anything else) with every unsafe character written as a backslash escape."""
    s = text if isinstance(text, str) else str(text)
    if _PLAIN.fullmatch(s):
        return s
    return "".join(_escape(c) if unicodedata.category(c) in _UNSAFE_CATEGORIES else c for c in s)


class PrintableFormatter(logging.Formatter):
    """Log lines a workload cannot forge: the message (which often names a cgroup or a process) goes
    through `printable`, and every line of a traceback is indented, so that nothing a name holds can
    start a line of its own that reads as koordd's."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        record.message = printable(message)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message        # other handlers format the record as it was

    def formatException(self, ei) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("  " + printable(line) for line in text.splitlines())
