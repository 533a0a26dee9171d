"""Netlink, through pyroute2, as the tc backend, the egress classifier and the net sensor share it:
koordd's HTB class ids and root handles, device lookups, HTB rates from a class's message, and
whether the kernel has a qdisc. The backend itself (what `tc.shaping` and `tc.be_ceil` mean) is
koordd/backends/tc.py."""
from __future__ import annotations

import gzip
import os
import re
from pathlib import Path
ROOT, LINK, LS_CLASS, BE_CLASS, OTHER_CLASS = 0x10000, 0x10001, 0x10010, 0x10020, 0x10030
TC_ROOT_PARENT = 0xFFFFFFFF
EDT_ROOT = 0xC0DD0000               # koordd's root qdisc under "edt": fq, or mq with an fq per tx queue
EDT_ROOT_KINDS = ("fq", "mq")
KOORDD_CLASSES = frozenset({LINK, LS_CLASS, BE_CLASS, OTHER_CLASS})
BURST_TIME, MIN_BURST = 0.005, 64 * 1024    # seconds of a class's rate it may send at once; bytes


def htb_rates(msg) -> tuple[int, int] | None:
    """(rate, ceil) in bit/s of an HTB class from its netlink message (64-bit values where they do not
    fit in 32 bits of bytes/s); None for a class of another kind."""
    opts = msg.get_attr("TCA_OPTIONS")
    parms = opts.get_attr("TCA_HTB_PARMS") if opts is not None else None
    if parms is None:
        return None
    return ((opts.get_attr("TCA_HTB_RATE64") or parms["rate"]) * 8,
            (opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]) * 8)


def kernel_has_qdisc(module: str, release: str | None = None, root: Path = Path("/")) -> bool | None:
    """Whether this kernel has a qdisc (module name, e.g. "sch_fq"), built in or as a module: from
    its modules lists, else its config; None where neither says."""
    release = release or os.uname().release
    moddir = root / "lib/modules" / release
    for listing in ("modules.builtin", "modules.dep"):
        try:
            if f"/{module}.ko" in (moddir / listing).read_text():
                return True
        except OSError:
            continue
    option = "CONFIG_NET_SCH_" + module.removeprefix("sch_").upper()
    for config in (root / "proc/config.gz", root / "boot" / f"config-{release}"):
        try:
            text = gzip.decompress(config.read_bytes()).decode() if config.suffix == ".gz" else config.read_text()
        except OSError:
            continue
        return re.search(rf"^{option}=[ym]$", text, re.M) is not None
    return None


def burst_bytes(rate: int) -> int:
    """Bytes a class of `rate` bit/s may send at once: BURST_TIME of its rate, at least MIN_BURST. tc's
    default (rate / HZ + one MTU, about a millisecond) loses the tokens of every late timer, and a GSO
    packet on a veth is up to 64 KB. EDT pacing gives a class behind its pace the same (netclass.py)."""
    return max(int(rate / 8 * BURST_TIME), MIN_BURST)


def device_index(ipr, device: str) -> int | None:
    """The index of network device `device`; None when there is none."""
    try:
        found = ipr.link_lookup(ifname=device)
    finally:
        drop_stray_acks(ipr)
    return found[0] if found else None


def device_links(ipr, index: int) -> list:
    """The link message of device `index` ([] when it is gone)."""
    try:
        return ipr.get_links(index)
    finally:
        drop_stray_acks(ipr)


def drop_stray_acks(ipr) -> None:
    """pyroute2 0.9 leaves the kernel's ACK of every single-link request (link_lookup, get_links(index))
    in a queue of its own that nothing reads: each pinned a page of koordd's memory (RSS grew 2.4 MiB a
    minute in scripts/soak with net_shaping on). Dropped here, between requests: koordd's netlink sockets
    join no multicast group, so nothing else lands there. A pyroute2 without that queue: nothing to do."""
    queues = getattr(getattr(getattr(ipr, "asyncore", None), "msg_queue", None), "queues", None)
    root = queues.get(0) if isinstance(queues, dict) else None
    while root is not None and not root.empty():
        root.get_nowait()
        root.task_done()
