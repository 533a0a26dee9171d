"""oom_shaping: who the kernel's OOM killer takes first, whether it takes a BE pod whole, and how
early the kernel reclaims (koordlet's sysreconcile, Katalyst's hostwatermark).

Writes, every tick (the actuator writes only what differs, so new processes are brought in line
within an interval; a child inherits its parent's value at fork, so most already are):
- `oom_score_adj` of every process of each BE class root and below = `be_oom_score_adj` (1000: BE
  goes first when the kernel must kill), and of each LS, LSR and LSE class root and below =
  `ls_oom_score_adj` (-900: last, but still killable; -1000 makes a process immune to the OOM
  killer and is written only where the config says -1000). 0 leaves a class alone.
- `memory.oom.group` = 1 on each BE pod or job (the children of the BE class roots) with
  `be_oom_group`: the kernel then kills the whole pod, never half of it (a pod missing one process is
  broken but still holds its memory). Never on a BE class root itself, empty or not: pods started under
  it would all die of one OOM (a root with no children gets none: koordd cannot tell one job from an
  empty slice that pods join before the next round). One an older koordd left on a root is given back.
  cgroup v2 only: on v1 and hybrid hosts the kernel has
  no such knob and the OOM killer takes one process at a time; there the loop asks once (for one pod)
  and the actuator's refusal is the one log line that says so (`koordctl doctor`: memory.oom.group).
- the node sysctls `vm.min_free_kbytes` (`min_free_kbytes`, KiB) and `vm.watermark_scale_factor`
  (`watermark_scale_factor`, 1/10000 of memory) through the sysctl backend (koordd/backends/sysctl.py):
  a higher min watermark and a wider gap to the low and high ones make kswapd reclaim earlier and in
  the background, so a burst of LS allocations meets free pages instead of direct reclaim. 0 leaves a
  sysctl alone (and puts koordd's value back if it had changed it). koordd refuses a min_free_kbytes
  above 10% of the node's memory: the kernel would take it and start OOM-killing at once.

The kubelet's cgroups: the kubelet gives every container's processes an oom_score_adj of its own
(Guaranteed -997, BestEffort 1000, Burstable 2..999) and sets memory.oom.group on every container
(cgroup v2, 1.28+). On its cgroups `oom_score_adj` is the kubelet's (koordd/core/kubelet.py): the
actuator refuses koordd's value there, once per cgroup, and the kubelet's values stand, unless
`[daemon] kubelet_override` names `oom_score_adj`. Its pods' memory.oom.group is free to set.

Never raises the score of (nor sets memory.oom.group on) an LS, LSR, LSE or SYSTEM cgroup, one that
holds such work (an LS job in be.slice: its BE root is skipped) or lies inside it: the actuator's
guard refuses those (koordd/act/protect.py), and the loop does not ask. An LS-class root that holds
another protected root (an LSR job inside ls.slice) is left alone too: the nested roots get their
score on their own, and the guard would not let a restore raise the holder's score back.

Every round the loop asks again for each knob it wants, and gives back every knob it holds and did
not ask for (koordd.core.loop.release_unasked): no memory.oom.group, score or sysctl outlives its reason.
A process that leaves a cgroup koordd set the score of (a BE process moved to an LS class, or anywhere
else) gets back the value it had before koordd in the next round, from the oom_score backend
(koordd/backends/oom.py), and at stop.

Restore (on stop, when the loop is disabled, an option set to 0 or a cgroup leaves its class):
each process gets back the value it had before koordd's first write, processes started since get
the value most of them had; a process whose value someone else changed after koordd keeps it, and a
sysctl someone else rewrote (the kernel does, for min_free_kbytes, when khugepaged starts) is left
with a decision saying so.
"""
from __future__ import annotations

from koordd.core.classes import BE, LATENCY_SENSITIVE
from koordd.core.loop import NODE, Action, Loop, release_unasked, restore
from koordd.core.options import Option
from koordd.core.protected import Protected
from koordd.core.snapshot import Snapshot
from koordd.core.targets import SYSCTL_TARGET

OOM_GROUP = "memory.oom.group"
SCORE = "oom_score_adj"
MIN_FREE, SCALE = "vm.min_free_kbytes", "vm.watermark_scale_factor"


class OomShaping(Loop):
    __doc__ = __doc__
    name = "oom_shaping"
    options = (
        Option("be_oom_score_adj", int, 1000, "oom_score_adj of BE processes (-1000..1000); 0 = leave alone",
               min=-1000, max=1000),
        Option("ls_oom_score_adj", int, -900, "oom_score_adj of LS, LSR and LSE processes; -1000 (never killed) "
               "only if set here; 0 = leave alone", min=-1000, max=1000),
        Option("be_oom_group", bool, True, "memory.oom.group = 1 on every BE pod or job (cgroup v2): the OOM "
               "killer takes the whole pod"),
        Option("min_free_kbytes", int, 0, "vm.min_free_kbytes in KiB (at most 10% of memory); 0 = leave alone",
               min=0, max=16 * 1024 * 1024),
        Option("watermark_scale_factor", int, 0, "vm.watermark_scale_factor (1..3000, 1/10000 of memory); "
               "0 = leave alone", min=0, max=3000),
    )

    @staticmethod
    def problems(settings) -> dict[str, str]:
        out = {}
        if settings.be_oom_score_adj and settings.ls_oom_score_adj and \
                settings.ls_oom_score_adj >= settings.be_oom_score_adj:
            out["ls_oom_score_adj"] = (f"{settings.ls_oom_score_adj} is not below be_oom_score_adj "
                                       f"{settings.be_oom_score_adj}: the OOM killer would take LS first")
        return out

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        out = set()
        if settings.be_oom_score_adj:
            out.add((BE, SCORE))
        if settings.ls_oom_score_adj:
            out |= {(cls, SCORE) for cls in LATENCY_SENSITIVE}
        if settings.be_oom_group:
            out.add((BE, OOM_GROUP))
        if settings.min_free_kbytes:
            out.add((NODE, MIN_FREE))
        if settings.watermark_scale_factor:
            out.add((NODE, SCALE))
        return frozenset(out)

    @staticmethod
    def needs(settings) -> frozenset[str]:
        return frozenset()            # the actuator reads every value it writes; the loop needs only the classes

    @staticmethod
    def members_of(settings) -> frozenset[str]:
        return frozenset({BE}) if settings.be_oom_group else frozenset()     # memory.oom.group goes on pods

    @staticmethod
    def decide(snapshot: Snapshot, settings, state) -> list[Action]:
        guard = Protected.of_snapshot(snapshot)
        actions: list[Action] = []
        if settings.be_oom_score_adj:
            for cg in sorted(snapshot.of_class(BE), key=lambda c: c.path):
                why = guard.why(cg.path)
                if why:
                    actions += _release(snapshot, cg.path, SCORE, f"{cg.path} {why}: its processes keep their scores")
                    continue
                actions.append(Action(cg.path, SCORE, str(settings.be_oom_score_adj),
                                      {"class": BE, SCORE: settings.be_oom_score_adj},
                                      f"BE processes first for the OOM killer (oom_score_adj "
                                      f"{settings.be_oom_score_adj})"))
        if settings.ls_oom_score_adj:
            for cg in sorted(snapshot.of_class(*LATENCY_SENSITIVE), key=lambda c: c.path):
                if cg.path in guard.holders:
                    # It holds another protected root (an LSR job in ls.slice): the actuator would refuse
                    # to raise its score back on restore (a holder's protection is never taken back), so
                    # the nested roots get the score each on their own and this one is left alone.
                    actions += _release(snapshot, cg.path, SCORE, f"{cg.path} {guard.holders[cg.path]}")
                    continue
                actions.append(Action(cg.path, SCORE, str(settings.ls_oom_score_adj),
                                      {"class": cg.cls, SCORE: settings.ls_oom_score_adj},
                                      f"{cg.cls} processes last for the OOM killer (oom_score_adj "
                                      f"{settings.ls_oom_score_adj})"))
        if settings.be_oom_group:
            actions += _oom_group(snapshot, guard)
        actions += _sysctls(snapshot, settings)
        # Every knob this loop holds and did not ask for this round goes back: its reason (a BE pod, a
        # class's process, an option set) no longer holds. One sweep, whatever case the code above forgot.
        return actions + release_unasked(snapshot.held, actions, KNOBS, "oom_shaping no longer asks for it: "
                                                                         "its reason is gone")


KNOBS = frozenset({SCORE, OOM_GROUP, MIN_FREE, SCALE})


def _oom_group(snapshot: Snapshot, guard: Protected) -> list[Action]:
    roots = {c.path for c in snapshot.of_class(BE)}
    units = sorted({u.path for u in snapshot.units(BE)})
    out = []
    for path in units:
        if path in roots:
            # Never a class root, empty or not: it is a class, not one job. Pods started under an empty
            # be.slice between two rounds would all die of one OOM while its memory.oom.group is 1.
            out += _release(snapshot, path, OOM_GROUP, f"{path} is a class root, not one job: its pods are not "
                                                       f"killed together")
            continue
        if guard.why(path):
            out += _release(snapshot, path, OOM_GROUP, f"{path} {guard.why(path)}: not killed as a group")
            continue
        out.append(Action(path, OOM_GROUP, "1", {"class": BE, "memory_oom_group": 1},
                          f"the OOM killer takes {path} whole, never part of it"))
        if OOM_GROUP not in snapshot.supported:
            break                     # refused for want of the knob: one pod says it, not every pod
    for root in sorted(roots):
        if snapshot.members.get(root):
            # A root that gained pods (units() lists them instead): memory.oom.group = 1 left on it by an
            # older koordd, set while it was empty, would kill every pod at the first OOM.
            out += _release(snapshot, root, OOM_GROUP, f"{root} holds pods now: one OOM must not kill them all")
    return out


def _sysctls(snapshot: Snapshot, settings) -> list[Action]:
    out = []
    for knob, value, unit in ((MIN_FREE, settings.min_free_kbytes, "KiB"), (SCALE, settings.watermark_scale_factor, "")):
        if not value:
            out += _release(snapshot, SYSCTL_TARGET, knob, f"{knob}: no longer set in oom_shaping")
            continue
        # A min_free_kbytes above 10% of memory is refused by the sysctl backend (it reads MemTotal).
        reason = {knob: value}
        out.append(Action(SYSCTL_TARGET, knob, str(value), reason,
                          f"{knob} {value}{' ' + unit if unit else ''}: kswapd reclaims earlier"))
    return out


def _release(snapshot: Snapshot, target: str, knob: str, why: str) -> list[Action]:
    """Give back a knob koordd holds on `target` and no longer wants; nothing if it holds none."""
    return [restore(target, knob, why)] if (target, knob) in snapshot.held else []
