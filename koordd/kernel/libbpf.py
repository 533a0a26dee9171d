"""koordd's one BPF loader: libbpf (libbpf.so.1, Debian's libbpf1, 1.1 or newer) through ctypes.

Every program koordd runs is a CO-RE object compiled once (scripts/build-bpf) against BTF; libbpf
relocates it against the running kernel's BTF (/sys/kernel/btf/vmlinux) while loading, so a node
needs no compiler, no kernel headers and no LLVM.

Everything attached is a BPF link held by one of this process's fds (tracing programs, tcx, struct_ops),
never pinned: when koordd stops, or is killed, the kernel detaches and frees it all.

A failure says what failed in the kernel's words: libbpf's log of the failed step (for a load, the
verifier's) goes to the journal at debug, its last line into the error.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable, Iterator

log = logging.getLogger("koordd.bpf")

LIBRARY = "libbpf.so.1"
BPF_F_SLEEPABLE = 1 << 4
BPF_F_LINK = 1 << 13                # a struct_ops map attached through a link
BPF_STRUCT_OPS = 44                 # enum bpf_attach_type
BPF_TCX_EGRESS = 47
BTF_KIND_DATASEC = 15
RODATA = ".rodata"                  # `const volatile` globals: set before load, constants after
PER_CPU_MAPS = {5, 6, 10}           # BPF_MAP_TYPE_PERCPU_HASH, _PERCPU_ARRAY, _LRU_PERCPU_HASH


class BpfError(RuntimeError):
    """A libbpf or kernel call failed; the message names the step and the kernel's reason (`errno`)."""

    def __init__(self, message: str, errno: int = 0):
        super().__init__(message)
        self.errno = errno


_p, _i, _u32, _u64, _s = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_char_p
_SIGNATURES = (
    ("libbpf_set_print", _p, [_p]),
    ("bpf_object__open_file", _p, [_s, _p]),
    ("bpf_object__load", _i, [_p]),
    ("bpf_object__close", None, [_p]),
    ("bpf_object__btf", _p, [_p]),
    ("bpf_object__find_map_by_name", _p, [_p, _s]),
    ("bpf_object__find_program_by_name", _p, [_p, _s]),
    ("bpf_object__next_program", _p, [_p, _p]),
    ("bpf_object__next_map", _p, [_p, _p]),
    ("bpf_program__name", _s, [_p]),
    ("bpf_program__section_name", _s, [_p]),
    ("bpf_program__fd", _i, [_p]),
    ("bpf_program__set_flags", _i, [_p, _u32]),
    ("bpf_program__set_autoattach", None, [_p, ctypes.c_bool]),
    ("bpf_program__attach", _p, [_p]),
    ("bpf_map__name", _s, [_p]),
    ("bpf_map__fd", _i, [_p]),
    ("bpf_map__key_size", _u32, [_p]),
    ("bpf_map__value_size", _u32, [_p]),
    ("bpf_map__max_entries", _u32, [_p]),
    ("bpf_map__type", _i, [_p]),
    ("libbpf_num_possible_cpus", _i, []),
    ("bpf_map__set_map_flags", _i, [_p, _u32]),
    ("bpf_map__initial_value", _p, [_p, ctypes.POINTER(ctypes.c_size_t)]),
    ("bpf_map__attach_struct_ops", _p, [_p]),
    ("bpf_link__fd", _i, [_p]),
    ("bpf_link__destroy", _i, [_p]),
    ("bpf_link_create", _i, [_i, _i, _i, _p]),
    ("bpf_map_update_elem", _i, [_i, _p, _p, _u64]),
    ("bpf_map_lookup_elem", _i, [_i, _p, _p]),
    ("bpf_map_delete_elem", _i, [_i, _p]),
    ("bpf_map_get_next_key", _i, [_i, _p, _p]),
    ("bpf_map_lookup_batch", _i, [_i, _p, _p, _p, _p, ctypes.POINTER(_u32), _p]),
    ("bpf_obj_get_info_by_fd", _i, [_i, _p, ctypes.POINTER(_u32)]),
    ("bpf_prog_query", _i, [_i, _i, _u32, ctypes.POINTER(_u32), _p, ctypes.POINTER(_u32)]),
    ("btf__find_by_name_kind", _i, [_p, _s, _u32]),
    ("btf__type_by_id", _p, [_p, _u32]),
    ("btf__name_by_offset", _s, [_p, _u32]),
)


@cache
def libbpf() -> ctypes.CDLL:
    """libbpf with the signatures koordd uses; BpfError when it is not installed."""
    try:
        lib = ctypes.CDLL(LIBRARY, use_errno=True)
    except OSError:
        raise BpfError(f"{LIBRARY} is not installed (apt-get install libbpf1)") from None
    for name, restype, argtypes in _SIGNATURES:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    _PRINT.install(lib)
    return lib


# sizeof(va_list) where it is a pointer to the caller's struct, which vsnprintf advances: keeping its bytes
# and putting them back is va_copy there. Elsewhere a message over 4 KiB stays cut, as before.
VA_LIST_BYTES = {"x86_64": 24, "aarch64": 32}.get(platform.machine(), 0)
MAX_MESSAGE = 16 << 20      # libbpf's largest verifier log


class _LibbpfLog:
    """libbpf's messages, kept while a step runs so a failure can quote them (its log callback gets a
    printf format and a va_list: libc's vsnprintf formats them)."""

    PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

    def __init__(self):
        self.lines: list[str] | None = None
        self.lock = threading.RLock()     # one step may run inside another
        self._callback = self.PRINT_FN(self._print)     # kept referenced: libbpf holds the pointer

    def install(self, lib: ctypes.CDLL) -> None:
        libc = ctypes.CDLL(None)
        self._vsnprintf = libc.vsnprintf
        self._vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
        lib.libbpf_set_print(ctypes.cast(self._callback, ctypes.c_void_p))

    def _print(self, level: int, fmt: bytes, args: int) -> int:
        # The verifier's log of a failed load comes as one message, often far over 4 KiB, and the reason
        # it failed is its end: a message that does not fit is formatted again into a buffer its size
        # (up to MAX_MESSAGE), its va_list put back first (VA_LIST_BYTES).
        saved = ctypes.string_at(args, VA_LIST_BYTES) if args and VA_LIST_BYTES else b""
        buf = ctypes.create_string_buffer(4096)
        needed = self._vsnprintf(buf, len(buf), fmt, args)
        if saved and len(buf) <= needed:
            ctypes.memmove(args, saved, len(saved))
            buf = ctypes.create_string_buffer(min(needed + 1, MAX_MESSAGE))
            self._vsnprintf(buf, len(buf), fmt, args)
        text = buf.value.decode(errors="replace").rstrip("\n")
        if self.lines is not None:
            self.lines.extend(text.splitlines())
        else:
            log.debug("libbpf: %s", text)
        return 0

    @contextmanager
    def kept(self) -> Iterator[list[str]]:
        with self.lock:
            outer, self.lines = self.lines, []
            try:
                yield self.lines
            finally:
                self.lines = outer


_PRINT = _LibbpfLog()


def _errno(code: int | None) -> int:
    return -code if code is not None and code < 0 else ctypes.get_errno()


@contextmanager
def step(what: str) -> Iterator[Callable[[int | None], BpfError]]:
    """Run one libbpf step; `fail(code)` inside it builds the error: the step, the kernel's reason, and
    libbpf's last line (its whole log to the journal at debug)."""
    with _PRINT.kept() as lines:
        def fail(code: int | None = None) -> BpfError:
            err = _errno(code)
            reason = os.strerror(err) if err else "failed"
            for line in lines:
                log.debug("libbpf: %s", line)
            last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
            return BpfError(f"{what}: {reason}" + (f" (libbpf: {last})" if last else ""), err)
        yield fail


class BpfMap:
    """One map of a loaded object, its keys and values as ctypes types of the sizes the map has."""

    def __init__(self, name: str, fd: int, key_type, value_type, max_entries: int):
        self.name, self.fd, self.key_type, self.value_type = name, fd, key_type, value_type
        self.max_entries = max_entries

    def lookup(self, key):
        value = self.value_type()
        if libbpf().bpf_map_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(value)) < 0:
            if ctypes.get_errno() == errno.ENOENT:
                return None
            raise BpfError(f"{self.name}: lookup: {os.strerror(ctypes.get_errno())}")
        return value

    def update(self, key, value, flags: int = 0) -> None:
        if (err := libbpf().bpf_map_update_elem(self.fd, ctypes.byref(key), ctypes.byref(value), flags)) < 0:
            raise BpfError(f"{self.name}: update: {os.strerror(_errno(err))}")

    def delete(self, key) -> bool:
        """False when the key was not there."""
        if (err := libbpf().bpf_map_delete_elem(self.fd, ctypes.byref(key))) < 0:
            if _errno(err) == errno.ENOENT:
                return False
            raise BpfError(f"{self.name}: delete: {os.strerror(_errno(err))}")
        return True

    def keys(self) -> list:
        """Every key, read before any is used (a key deleted meanwhile would restart the walk)."""
        out, key, prev = [], self.key_type(), None
        lib = libbpf()
        while lib.bpf_map_get_next_key(self.fd, None if prev is None else ctypes.byref(prev), ctypes.byref(key)) == 0:
            out.append(key)
            if len(out) > self.max_entries:     # a map changing under the walk: never loop forever
                break
            prev, key = key, self.key_type()
        return out

    BATCH = 256     # entries per bpf(BPF_MAP_LOOKUP_BATCH): a few syscalls a round instead of two per entry

    def items(self) -> list[tuple]:
        """Every (key, value), read in batches; key by key where the kernel has no batch for the map."""
        got = self._batched()
        return got if got is not None else [(k, v) for k in self.keys() if (v := self.lookup(k)) is not None]

    def _batched(self) -> list[tuple] | None:
        lib, out = libbpf(), []
        keys, values = (self.key_type * self.BATCH)(), (self.value_type * self.BATCH)()
        # The kernel's resume token: a hash map's is a bucket index (u32), others' a key.
        token_size = max(ctypes.sizeof(self.key_type), 8)
        tokens = [ctypes.create_string_buffer(token_size), ctypes.create_string_buffer(token_size)]
        resume = None
        while True:
            count = _u32(self.BATCH)
            err = lib.bpf_map_lookup_batch(self.fd, resume, tokens[0], keys, values, ctypes.byref(count), None)
            code = _errno(err) if err < 0 else 0
            if code not in (0, errno.ENOENT):
                return None         # EINVAL: no batch ops for this map (or kernel); ENOSPC: a huge bucket
            for i in range(count.value):
                key, value = self.key_type(), self.value_type()
                ctypes.memmove(ctypes.byref(key), ctypes.byref(keys, i * ctypes.sizeof(key)), ctypes.sizeof(key))
                ctypes.memmove(ctypes.byref(value), ctypes.byref(values, i * ctypes.sizeof(value)),
                               ctypes.sizeof(value))
                out.append((key, value))
            if code == errno.ENOENT or len(out) > self.max_entries:
                return out
            tokens.reverse()            # this call's out token is the next call's in token
            resume = tokens[1]

    def clear(self) -> None:
        for key in self.keys():
            self.delete(key)


def tcx_egress_programs(ifindex: int, most: int = 64) -> list[int]:
    """The ids of the programs on a device's tcx egress hook, in run order (empty where the kernel has
    no tcx)."""
    ids, count, flags = (_u32 * most)(), _u32(most), _u32()
    if libbpf().bpf_prog_query(ifindex, BPF_TCX_EGRESS, 0, ctypes.byref(flags), ids, ctypes.byref(count)) < 0:
        return []
    return list(ids[:count.value])


def has_tcx() -> bool:
    """Whether the kernel takes tcx links (Linux 6.6+): older ones refuse the query on loopback."""
    return libbpf().bpf_prog_query(1, BPF_TCX_EGRESS, 0, None, None, ctypes.byref(_u32(0))) >= 0


class ProgInfo(ctypes.Structure):
    """struct bpf_prog_info up to recursion_misses (the kernel fills what fits in the length given)."""
    _fields_ = [("type", _u32), ("id", _u32), ("tag", ctypes.c_uint8 * 8), ("jited_prog_len", _u32),
                ("xlated_prog_len", _u32), ("jited_prog_insns", _u64), ("xlated_prog_insns", _u64),
                ("load_time", _u64), ("created_by_uid", _u32), ("nr_map_ids", _u32), ("map_ids", _u64),
                ("name", ctypes.c_char * 16), ("ifindex", _u32), ("gpl_compatible", _u32),
                ("netns_dev", _u64), ("netns_ino", _u64), ("nr_jited_ksyms", _u32), ("nr_jited_func_lens", _u32),
                ("jited_ksyms", _u64), ("jited_func_lens", _u64), ("btf_id", _u32), ("func_info_rec_size", _u32),
                ("func_info", _u64), ("nr_func_info", _u32), ("nr_line_info", _u32), ("line_info", _u64),
                ("jited_line_info", _u64), ("nr_jited_line_info", _u32), ("line_info_rec_size", _u32),
                ("jited_line_info_rec_size", _u32), ("nr_prog_tags", _u32), ("prog_tags", _u64),
                ("run_time_ns", _u64), ("run_cnt", _u64), ("recursion_misses", _u64)]


@dataclass(frozen=True)
class ProgramStats:
    """What one loaded program costs inside the kernel. run_time_ns and run_cnt count only while
    kernel.bpf_stats_enabled is 1 (the kernel's own switch: counting costs a clock read per run)."""
    name: str
    attach: str             # its section: where it runs (e.g. tp_btf/sched_switch)
    prog_id: int
    run_time_ns: int
    run_cnt: int


class _BtfType(ctypes.Structure):
    _fields_ = [("name_off", _u32), ("info", _u32), ("size", _u32)]


class _VarSecinfo(ctypes.Structure):
    _fields_ = [("type", _u32), ("offset", _u32), ("size", _u32)]


_LOADED: "weakref.WeakSet[BpfObject]" = weakref.WeakSet()     # every object this process has loaded


def stats_enabled(proc: Path = Path("/proc")) -> bool | None:
    """kernel.bpf_stats_enabled: whether the kernel counts each program's run time (None: unreadable)."""
    try:
        return (proc / "sys/kernel/bpf_stats_enabled").read_text().strip() == "1"
    except OSError:
        return None


def report(proc: Path = Path("/proc")) -> dict:
    """What this process has in the kernel, for koordctl doctor (through the status file): each loaded
    object's programs (where they are attached, their run time and count) and maps (their sizes)."""
    return {"stats_enabled": stats_enabled(proc),
            "objects": sorted((o.describe() for o in list(_LOADED) if o.obj), key=lambda d: d["object"])}


def loaded() -> frozenset[tuple[str, int]]:
    """The objects this process has loaded now, by path and identity (a sensor restarted loads its object
    anew): what report() would list, at a cheap look."""
    return frozenset((str(o.path), id(o)) for o in list(_LOADED) if o.obj)


class BpfObject:
    """One CO-RE object: opened, prepared (`prepare(self)` before the load: flags, read-only data),
    loaded; its programs attached through links; everything freed by `close` (or by the kernel when
    this process ends)."""

    def __init__(self, path: Path | str, prepare: Callable[[BpfObject], None] | None = None):
        self.path = Path(path)
        self.lib = lib = libbpf()
        self.links: list[int] = []          # struct bpf_link pointers libbpf made
        self.link_fds: list[int] = []       # links made here with bpf_link_create
        self.attached: dict[str, list[str]] = {}    # program (or struct_ops map) -> where it runs
        self.tcx_fds: dict[int, tuple[str, str]] = {}   # tcx link fd -> (program, its hook's name)
        with step(f"opening {self.path}") as fail:
            self.obj = lib.bpf_object__open_file(str(self.path).encode(), None)
            if not self.obj:
                raise fail()
        try:
            if prepare is not None:
                prepare(self)
            with step(f"loading {self.path.name}") as fail:
                if (err := lib.bpf_object__load(self.obj)) < 0:
                    raise fail(err)
        except BaseException:
            self.close()
            raise
        _LOADED.add(self)

    # --- before the load ------------------------------------------------------------------------

    def _program(self, name: str) -> int:
        prog = self.lib.bpf_object__find_program_by_name(self.obj, name.encode())
        if not prog:
            raise BpfError(f"{self.path.name} has no program {name}")
        return prog

    def _map(self, name: str) -> int:
        m = self.lib.bpf_object__find_map_by_name(self.obj, name.encode())
        if not m:
            raise BpfError(f"{self.path.name} has no map {name}")
        return m

    def set_sleepable(self, program: str) -> None:
        if self.lib.bpf_program__set_flags(self._program(program), BPF_F_SLEEPABLE):
            raise BpfError(f"cannot mark {program} sleepable")

    def set_map_flags(self, name: str, flags: int) -> None:
        if self.lib.bpf_map__set_map_flags(self._map(name), flags):
            raise BpfError(f"cannot set {name}'s flags")

    def set_rodata(self, **values: int) -> None:
        """Set `const volatile` globals (the program's read-only data) by name, before the load."""
        lib = self.lib
        rodata = next((m for m in self._maps() if lib.bpf_map__name(m).endswith(RODATA.encode())), None)
        btf = lib.bpf_object__btf(self.obj)
        sec_id = lib.btf__find_by_name_kind(btf, RODATA.encode(), BTF_KIND_DATASEC) if btf else -1
        if rodata is None or sec_id < 0:
            raise BpfError(f"{self.path.name} has no read-only data")
        size = ctypes.c_size_t()
        data = lib.bpf_map__initial_value(rodata, ctypes.byref(size))
        sec = _BtfType.from_address(lib.btf__type_by_id(btf, sec_id))
        entries = (_VarSecinfo * (sec.info & 0xffff)).from_address(
            lib.btf__type_by_id(btf, sec_id) + ctypes.sizeof(_BtfType))
        where = {}
        for entry in entries:
            var = _BtfType.from_address(lib.btf__type_by_id(btf, entry.type))
            where[lib.btf__name_by_offset(btf, var.name_off).decode()] = (entry.offset, entry.size)
        for name, value in values.items():
            if name not in where:
                raise BpfError(f"{self.path.name} has no read-only variable {name}")
            offset, width = where[name]
            if offset + width > size.value:
                raise BpfError(f"{name} lies outside {self.path.name}'s read-only data")
            ctypes.memmove(data + offset, int(value).to_bytes(width, "little"), width)

    def _maps(self) -> Iterator[int]:
        m = self.lib.bpf_object__next_map(self.obj, None)
        while m:
            yield m
            m = self.lib.bpf_object__next_map(self.obj, m)

    def _programs(self) -> Iterator[int]:
        p = self.lib.bpf_object__next_program(self.obj, None)
        while p:
            yield p
            p = self.lib.bpf_object__next_program(self.obj, p)

    # --- after the load -------------------------------------------------------------------------

    def map(self, name: str, key_type, value_type) -> BpfMap:
        """A map by name, its keys and values as these ctypes types. A per-CPU map's values are arrays of
        `value_type`, one per possible CPU (the kernel's layout: each rounded up to 8 bytes)."""
        m = self._map(name)
        for what, want, have in (("key", ctypes.sizeof(key_type), self.lib.bpf_map__key_size(m)),
                                 ("value", ctypes.sizeof(value_type), self.lib.bpf_map__value_size(m))):
            if want != have:        # a wrong size would make the kernel write past a ctypes buffer
                raise BpfError(f"{self.path.name}: map {name}'s {what} is {have} bytes, not {want}")
        if self.lib.bpf_map__type(m) in PER_CPU_MAPS:
            if ctypes.sizeof(value_type) % 8:
                raise BpfError(f"{self.path.name}: per-CPU map {name}'s value is not a multiple of 8 bytes")
            value_type = value_type * self.lib.libbpf_num_possible_cpus()
        return BpfMap(name, self.lib.bpf_map__fd(m), key_type, value_type, self.lib.bpf_map__max_entries(m))

    def attach(self, program: str) -> None:
        """Attach a program where its section says (tp_btf/, tracepoint/, raw_tp/...)."""
        with step(f"attaching {program}") as fail:
            prog = self._program(program)
            link = self.lib.bpf_program__attach(prog)
            if not link:
                raise fail()
        self.links.append(link)
        self.attached.setdefault(program, []).append(self.lib.bpf_program__section_name(prog).decode())

    def attach_all(self) -> None:
        for prog in self._programs():
            self.attach(self.lib.bpf_program__name(prog).decode())

    def program_fd(self, program: str) -> int:
        return self.lib.bpf_program__fd(self._program(program))

    def attach_tcx_egress(self, program: str, ifindex: int) -> int:
        """Run a tc program on a device's egress through a tcx link (kernel 6.6+): it goes when the
        link's fd closes. Returns the link fd (closed by `detach` or `close`)."""
        fd = self.program_fd(program)
        with step(f"attaching {program} to device {ifindex}'s egress (tcx)") as fail:
            link = self.lib.bpf_link_create(fd, ifindex, BPF_TCX_EGRESS, None)
            if link < 0:
                raise fail(link)
        self.link_fds.append(link)
        hook = f"tcx egress of device {ifindex}"
        self.tcx_fds[link] = (program, hook)
        self.attached.setdefault(program, []).append(hook)
        return link

    def attach_struct_ops(self, name: str) -> None:
        """Register a struct_ops map (e.g. a sched_ext scheduler) through a link. libbpf 1.1 cannot make
        struct_ops links (1.2+ can): with BPF_F_LINK set before the load, it only writes the map's value
        and the link is made here."""
        ops = self._map(name)
        with step(f"writing {name}'s struct_ops value") as fail:
            link = self.lib.bpf_map__attach_struct_ops(ops)
            if not link:
                raise fail()
        self.links.append(link)
        self.attached.setdefault(name, []).append("struct_ops")
        map_fd = self.lib.bpf_map__fd(ops)
        if self.lib.bpf_link__fd(link) == map_fd:
            with step(f"attaching {name} (bpf_link_create)") as fail:
                fd = self.lib.bpf_link_create(map_fd, 0, BPF_STRUCT_OPS, None)
                if fd < 0:
                    raise fail(fd)
            self.link_fds.append(fd)

    def detach(self, link_fd: int) -> None:
        if link_fd in self.link_fds:
            self.link_fds.remove(link_fd)
            os.close(link_fd)
            if link_fd in self.tcx_fds:
                program, hook = self.tcx_fds.pop(link_fd)
                self.attached[program].remove(hook)

    def stats(self) -> list[ProgramStats]:
        out = []
        for prog in self._programs():
            fd = self.lib.bpf_program__fd(prog)
            if fd < 0:
                continue
            info, size = ProgInfo(), _u32(ctypes.sizeof(ProgInfo))
            if self.lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)) < 0:
                continue
            out.append(ProgramStats(self.lib.bpf_program__name(prog).decode(),
                                    self.lib.bpf_program__section_name(prog).decode(), info.id,
                                    info.run_time_ns, info.run_cnt))
        return out

    def describe(self) -> dict:
        """Its programs (where they run, their kernel ids and run time) and maps (their sizes)."""
        stats = {s.name: s for s in self.stats()}
        programs = [{"name": name, "section": s.attach, "id": s.prog_id, "attached": self.attached.get(name, []),
                     "run_time_ns": s.run_time_ns, "run_cnt": s.run_cnt} for name, s in sorted(stats.items())]
        maps = []
        for m in self._maps():
            name = self.lib.bpf_map__name(m).decode()
            maps.append({"name": name, "max_entries": self.lib.bpf_map__max_entries(m),
                         "key_size": self.lib.bpf_map__key_size(m), "value_size": self.lib.bpf_map__value_size(m),
                         "attached": self.attached.get(name, [])})
        return {"object": self.path.name, "programs": programs, "maps": maps}

    def close(self) -> None:
        """Detach everything (links first: the kernel stops running the programs) and free the object."""
        for fd in self.link_fds:
            os.close(fd)
        self.link_fds = []
        for link in self.links:
            self.lib.bpf_link__destroy(link)    # libbpf 1.1 frees a struct_ops link only; our fd detaches it
        self.links = []
        self.attached, self.tcx_fds = {}, {}
        _LOADED.discard(self)
        if self.obj:
            self.lib.bpf_object__close(self.obj)
            self.obj = None
