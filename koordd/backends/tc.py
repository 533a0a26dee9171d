"""The tc knobs of a network device: how koordd enforces egress shaping on it, and BE's ceiling.

Kind "tc", a target is a device name. Everything goes through netlink (pyroute2), no `tc` process.
- `tc.shaping`, the device's root qdisc:
  - "htb <bit/s>": koordd's HTB tree: HTB `1:` whose unclassified traffic goes to `1:30`, the root
    class `1:1` at the link rate, and under it LS `1:10` and other traffic `1:30` (rate and ceil the
    link rate, priority 0) and BE `1:20` (a 1% guarantee, ceil the link rate until `tc.be_ceil`
    lowers it, priority 7: last to borrow). Packets reach LS and BE by their `skb->priority`, set by
    the egress classifier (koordd/kernel/netclass.py) from their socket's cgroup.
  - "edt": an `fq` root qdisc with koordd's handle `c0dd:` (on a multi-queue device `mq` there,
    an fq per tx queue); the classifier stamps each BE packet's
    departure time from BE's ceiling and fq holds it until then (Earliest Departure Time, as
    Cilium's bandwidth manager does). No link rate: the device itself is the bottleneck.
  - "none": the kernel's own root qdisc (handle 0:, or none at all): restoring deletes koordd's
    qdisc and the kernel puts its default back.
  A root qdisc someone else created reads "foreign <kind> <handle>", and koordd refuses to replace it.
  "partial htb": koordd's tree cut short (koordd killed while it built it: HTB `1:` whose unclassified
  traffic goes to `1:30`, with only some of koordd's classes): setting any value takes it down first,
  restoring it takes it down.
- `tc.replace_root`, a command: "<kind> <handle>" deletes that root qdisc, someone else's, so that
  koordd's can take its place (net_shaping's `take_over`). The kernel's default comes back in its
  stead, and that is what koordd restores on stop: it cannot rebuild another's qdisc.
- `tc.be_ceil`: BE's ceiling in bit/s: class `1:20`'s ceil (at most the link rate), or BE's pace in
  the classifier under "edt". "none": no ceiling (the link rate under "htb").
"""
from __future__ import annotations

import errno
import os
import re
import socket

from koordd.backends.netclass import process_classifier
from koordd.core.backend import Backend, BackendSet, InvalidValue, KnobSpec, TargetGone, Unsupported
from koordd.core.units import parse_rate
from koordd.kernel.cgroupfs import CgroupFS
from koordd.kernel.host_probe import Host, installed
from koordd.kernel.netlink import (BE_CLASS, EDT_ROOT, EDT_ROOT_KINDS, KOORDD_CLASSES, LINK, LS_CLASS, OTHER_CLASS,
    ROOT, TC_ROOT_PARENT, burst_bytes, device_index, device_links, htb_rates, kernel_has_qdisc)

PARTIAL = "partial htb"             # koordd's HTB tree, some of its classes not made yet (a kill mid-build)
BE_GUARANTEE = 0.01                 # of the link: BE's rate, what it gets even when LS wants it all


def _shaping_value(value: str) -> str:
    v = value.strip()
    if v in ("none", "edt"):
        return v
    kind, _, rate = v.partition(" ")
    if kind != "htb":
        raise InvalidValue(f"tc.shaping must be \"htb <rate>\", \"edt\" or \"none\", got {value!r}")
    return f"htb {parse_rate(rate)}"


def _ceil_value(value: str) -> str:
    return "none" if value.strip() == "none" else str(parse_rate(value))


def _root_value(value: str) -> str:
    kind, _, handle = value.strip().partition(" ")
    if not kind or not re.fullmatch(r"[0-9a-f]{1,4}:", handle):
        raise InvalidValue(f"tc.replace_root must be \"<kind> <handle>\", e.g. \"htb 5:\", got {value!r}")
    return f"{kind} {handle}"


def _htb_default(root) -> int | None:
    """The class an HTB root qdisc sends unclassified traffic to (full handle), from its netlink message."""
    opts = root.get_attr("TCA_OPTIONS")
    init = opts.get_attr("TCA_HTB_INIT") if opts is not None else None
    return None if init is None else (root["handle"] & 0xFFFF0000) | init["defcls"]


def _handle(h: int) -> str:
    return f"{h >> 16:x}:{h & 0xFFFF:x}" if h & 0xFFFF else f"{h >> 16:x}:"


def probe_netlink(host: Host) -> tuple[bool, str]:
    # Not imported: pyroute2 costs some 16 MB of RSS, paid only where a loop shapes traffic.
    why = installed("pyroute2")
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE).close()
        raw = "a raw NETLINK_ROUTE socket opens"
    except OSError as e:
        return False, f"{why or 'pyroute2 installed'}; a raw NETLINK_ROUTE socket fails: {e}"
    fq = {True: "an fq qdisc for enforce = \"edt\"",
          False: "no fq qdisc (CONFIG_NET_SCH_FQ): net_shaping's enforce = \"edt\" is refused, htb works",
          None: "whether there is an fq qdisc (for edt) is in no module list or config"}[
        kernel_has_qdisc("sch_fq", root=host.proc.parent)]
    return (False, f"{why}; {raw}") if why else (True, f"pyroute2 installed; {raw}; {fq}")


class TcBackend(Backend):
    kind = "tc"
    features = {"netlink": probe_netlink}
    knobs = {
        "tc.shaping": KnobSpec("tc.shaping", "how koordd enforces egress shaping on the device: \"htb <bit/s>\" "
                               "(its HTB tree), \"edt\" (fq, BE paced by the classifier) or \"none\" (the "
                               "kernel's default root qdisc)", _shaping_value),
        "tc.be_ceil": KnobSpec("tc.be_ceil", "BE's egress ceiling on the device, bit/s (\"none\": no ceiling)",
                               _ceil_value),
        "tc.replace_root": KnobSpec("tc.replace_root", "deletes someone else's root qdisc on the device (\"<kind> "
                                    "<handle>\") for koordd's to take its place", _root_value, oneshot=True),
    }

    def __init__(self, classifier=None, ipr=None):
        self.classifier = classifier    # a SharedClassifier: BE's pace under "edt"
        self._ipr = ipr             # an IPRoute (tests may hand one in); opened at first use otherwise

    @property
    def ipr(self):
        if self._ipr is None:
            try:
                from pyroute2 import IPRoute
            except ImportError:
                raise Unsupported("pyroute2 is not installed") from None
            self._ipr = IPRoute()
        return self._ipr

    def probe(self) -> dict[str, str]:
        # Found, not imported: pyroute2 costs some 16 MB of RSS, paid at the first tc knob used.
        if self._ipr is None and installed("pyroute2") is not None:
            return {k: "no netlink: pyroute2 is not installed" for k in self.knobs}
        return {}

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    # --- reading the device -------------------------------------------------------------------

    def _index(self, device: str) -> int:
        index = device_index(self.ipr, device)
        if index is None:
            raise TargetGone(device)
        return index

    def _root(self, index: int):
        return next((m for m in self.ipr.get_qdiscs(index) if m["parent"] == TC_ROOT_PARENT), None)

    def _classes(self, index: int) -> dict[int, tuple[int, int]]:
        """HTB class handle -> (rate, ceil) in bit/s."""
        out = {}
        for m in self.ipr.get_classes(index):
            rates = htb_rates(m)
            if rates is not None:
                out[m["handle"]] = rates
        return out

    def _shaping(self, index: int) -> str:
        root = self._root(index)
        if root is None or root["handle"] == 0:
            return "none"
        kind = root.get_attr("TCA_KIND")
        if kind in EDT_ROOT_KINDS and root["handle"] == EDT_ROOT:
            return "edt"
        classes = self._classes(index) if kind == "htb" else {}
        if root["handle"] == ROOT and KOORDD_CLASSES <= classes.keys():
            return f"htb {classes[LINK][0]}"
        if root["handle"] == ROOT and kind == "htb" and classes.keys() < KOORDD_CLASSES and _htb_default(root) == OTHER_CLASS:
            return PARTIAL
        return f"foreign {kind} {_handle(root['handle'])}"

    def _pacer(self):
        if self.classifier is None:
            raise Unsupported("no egress classifier to pace BE (edt)")
        return self.classifier.get()

    def identity(self, target: str, knob: str) -> str | None:
        """The device's ifindex: a device of the same name made since is another one."""
        return f"ifindex {self._index(target)}"

    def still_koordds(self, target: str, knob: str, current: str, values) -> bool:
        # koordd's tree cut short by a kill mid-build reads "partial htb": koordd's to take down.
        return current == PARTIAL or super().still_koordds(target, knob, current, values)

    def validate_original(self, target: str, knob: str, value: str) -> str:
        # A tree cut short as the original (no journal entry for it): write() takes it down.
        return value if value == PARTIAL else self.validate(target, knob, value)

    def read(self, target: str, knob: str) -> str:
        index = self._index(target)
        shaping = self._shaping(index)
        if knob == "tc.shaping":
            return shaping
        if shaping == "edt":
            rate = self._pacer().paces(index).get(BE_CLASS)
            return "none" if rate is None else str(rate)
        classes = self._classes(index)
        if not shaping.startswith("htb ") or BE_CLASS not in classes:
            raise Unsupported(f"{target} has no koordd shaping (tc.shaping)")
        return str(classes[BE_CLASS][1])

    def validate(self, target: str, knob: str, value: str) -> str:
        v = self.knobs[knob].normalize(value)
        index = self._index(target)
        current = self._shaping(index)
        if knob == "tc.shaping" and current.startswith("foreign "):
            raise InvalidValue(f"{target}'s root qdisc ({current[8:]}) is not koordd's: left alone "
                               f"(loops.net_shaping.take_over = true replaces it)")
        if knob == "tc.replace_root":
            if current != f"foreign {v}":
                raise InvalidValue(f"{target}'s root qdisc is {current}, not someone else's {v}: nothing replaced")
            return v
        if knob == "tc.shaping" and v == "edt" and current != "edt":
            if kernel_has_qdisc("sch_fq") is False:
                raise Unsupported("this kernel has no fq qdisc (CONFIG_NET_SCH_FQ) to hold paced packets: "
                                  "edt cannot be enforced here, htb can")
            self._pacer()
        if knob == "tc.be_ceil":
            if current == "edt":
                self._pacer()
            elif not current.startswith("htb "):
                raise Unsupported(f"{target} has no koordd shaping (tc.shaping)")
            elif v == "none":
                v = current.split()[1]
            elif int(v) > (link := int(current.split()[1])):
                raise InvalidValue(f"BE's ceil {v} bit/s is above {target}'s link rate {link} bit/s")
            if v != "none":
                # HTB and the pacer hold bytes per second: 16418394 bit/s reads back 16418392. Written as
                # it reads, or the next write is not skipped as equal and the restore at stop takes
                # koordd's own value for someone else's ("changed by someone else ... it reads '16418392'").
                v = str(max(int(v) // 8 * 8, 8))
        return v

    # --- writing ------------------------------------------------------------------------------

    def write(self, target: str, knob: str, value: str) -> None:
        index = self._index(target)
        try:
            current = self._shaping(index)
            if knob == "tc.replace_root":
                kind, handle = value.split()
                self.ipr.tc("del", kind, index, int(handle[:-1], 16) << 16)
                return
            if knob == "tc.be_ceil":
                if current == "edt":
                    self._pacer().set_pace(index, BE_CLASS, None if value == "none" else int(value))
                    return
                rate, link = self._classes(index)[BE_CLASS][0], int(current.split()[1])
                self._class("change-class", index, BE_CLASS, rate, link if value == "none" else int(value), 7)
                return
            ours = current in ("edt", PARTIAL) or current.startswith("htb ")
            if ours and value.split()[0] != current.split()[0]:
                self._remove(index, current)        # to "none", from one enforcement to the other, or a cut tree
            if value == "edt":
                self._install_edt(index)
            elif value not in ("none", PARTIAL):    # a cut tree as the original (no journal entry for it): gone
                self._install(index, int(value.split()[1]))
        except OSError as e:
            if e.errno == errno.ENODEV:
                raise TargetGone(target) from None
            raise
        except Exception as e:  # noqa: BLE001 - pyroute2's NetlinkError carries the kernel's errno as .code
            code = getattr(e, "code", None)
            if code == errno.ENODEV:
                raise TargetGone(target) from None
            if code:
                raise OSError(code, os.strerror(code)) from None
            raise

    def _remove(self, index: int, current: str) -> None:
        """koordd's root qdisc off the device (the kernel puts its default back), and BE's pace with it."""
        if current == "edt":
            self.ipr.tc("del", self._root(index).get_attr("TCA_KIND"), index, EDT_ROOT)
        else:
            self.ipr.tc("del", "htb", index, ROOT)
        opened = self.classifier.opened_classifier() if self.classifier is not None else None
        if opened is not None:
            opened.set_pace(index, BE_CLASS, None)

    def _install_edt(self, index: int) -> None:
        """fq at the root of a single-queue device; on a multi-queue one mq with an fq per tx queue,
        so each queue has its own lock (as Cilium's bandwidth manager does)."""
        links = device_links(self.ipr, index)
        queues = (links[0].get_attr("IFLA_NUM_TX_QUEUES") or 1) if links else 1
        if queues == 1:
            self.ipr.tc("add", "fq", index, EDT_ROOT)
            return
        self.ipr.tc("add", "mq", index, EDT_ROOT)
        for queue in range(1, queues + 1):
            self.ipr.tc("replace", "fq", index, 0, parent=EDT_ROOT | queue)

    def _class(self, command: str, index: int, handle: int, rate: int, ceil: int, prio: int) -> None:
        self.ipr.tc(command, "htb", index, handle, parent=ROOT if handle == LINK else LINK,
                    rate=f"{rate}bit", ceil=f"{ceil}bit", prio=prio, burst=burst_bytes(rate), cburst=burst_bytes(ceil))

    def _install(self, index: int, link: int) -> None:
        """koordd's tree at `link` bit/s: made where the kernel's default is, re-rated where it is ours
        (BE's ceil kept, within the new link rate)."""
        if self._shaping(index) == "none":
            self.ipr.tc("add", "htb", index, ROOT, default=OTHER_CLASS & 0xFFFF)
            self._class("add-class", index, LINK, link, link, 0)
            for handle in (LS_CLASS, OTHER_CLASS):
                self._class("add-class", index, handle, link, link, 0)
            self._class("add-class", index, BE_CLASS, max(int(link * BE_GUARANTEE), 8), link, 7)
            return
        be_ceil = min(self._classes(index)[BE_CLASS][1], link)
        self._class("change-class", index, LINK, link, link, 0)
        for handle in (LS_CLASS, OTHER_CLASS):
            self._class("change-class", index, handle, link, link, 0)
        self._class("change-class", index, BE_CLASS, max(int(link * BE_GUARANTEE), 8), be_ceil, 7)


def backends(fs: CgroupFS) -> list[Backend]:
    """What this module brings to koordd's backends: a device's HTB tree,
    pacing BE through the classifier this process shares with the netclass backends."""
    return [TcBackend(process_classifier())]


BACKENDS = BackendSet((TcBackend,), backends)     # koordd/core/catalogue.py BUILTIN
