"""A pynvml of files, for the NVML probe that runs in a child process (koordd/sensors/gpu.py): a module the
child imports from a directory put on sys.path, whose nvmlInit dlopens a shared library named
libnvidia-ml.so.1 (a copy of Python's own _json extension module, which needs nothing but libc: an ELF
object on every host that runs the tests, whatever is installed) and notes, in a log beside it, which process called what.

    lib = fake_pynvml(tmp_path, count=2)            # or init_error="Driver Not Loaded"
    monkeypatch.syspath_prepend(str(tmp_path)); monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    ... probe ...
    calls(tmp_path)                                 # [("init", pid), ("count", pid), ("shutdown", pid)]
"""
from __future__ import annotations

import _json
import shutil
from pathlib import Path

LIBRARY = "libnvidia-ml.so.1"

_MODULE = '''\
import ctypes, os
HERE = os.path.dirname(os.path.abspath(__file__))
class NVMLError(Exception):
    pass
def _note(what):
    with open(os.path.join(HERE, "nvml.log"), "a") as f:
        f.write(f"{{what}} {{os.getpid()}}\\n")
def nvmlInit():
    _note("init")
    if os.path.exists(os.path.join(HERE, {library!r})):
        ctypes.CDLL(os.path.join(HERE, {library!r}))      # NVML's dlopen, which nothing undoes
    if {init_error!r}:
        raise NVMLError({init_error!r})
def nvmlDeviceGetCount():
    _note("count")
    if {crash!r}:
        raise RuntimeError("the binding broke")
    return {count!r}
def nvmlShutdown():
    _note("shutdown")
'''


def fake_pynvml(directory: Path, count: int = 2, init_error: str | None = None, crash: bool = False) -> Path | None:
    """Write pynvml.py and the library into `directory`; the library's path (None on a Python whose
    extension modules are all built in: then nothing is loaded, and only the calls' pids tell)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pynvml.py").write_text(_MODULE.format(library=LIBRARY, init_error=init_error, count=count,
                                                        crash=crash))
    (directory / "nvml.log").unlink(missing_ok=True)
    source = getattr(_json, "__file__", None)
    if not source:
        return None
    lib = directory / LIBRARY
    lib.unlink(missing_ok=True)     # a new file, never one rewritten in place: a process may have it mapped
    shutil.copyfile(source, lib)
    return lib


def calls(directory: Path) -> list[tuple[str, int]]:
    try:
        lines = (directory / "nvml.log").read_text().split()
    except FileNotFoundError:
        return []
    return [(what, int(pid)) for what, pid in zip(lines[::2], lines[1::2])]


def mapped(library: Path) -> bool:
    """Whether this process has `library` mapped (/proc/self/maps)."""
    return str(library) in Path("/proc/self/maps").read_text()
