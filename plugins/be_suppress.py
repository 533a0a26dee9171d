"""be_suppress: keep best-effort (BE) CPU use below what latency-sensitive work leaves over.

Two rules decide how much CPU BE may use (`rule`):

- "slack" (Heracles' way): LS health, not LS usage, decides. Slack is how far the worst LS, LSR or
  LSE cgroup is from its class's health targets (`[classes.health]`), as a fraction of them:
  run-queue latency p99 against `runq_p99` (where only schedstat is there, the mean against
  `runq_mean`) and `cpu.pressure` "some" avg10 against `cpu_pressure`; where the class declares an
  SLO (`[classes.slo]`, core/slo.py), also its service's own response times at the SLO's quantile
  against `latency_p99` (and p99.9 against `latency_p999`), over at least 1000 responses (at most 10 s),
  so harm that shows in no run queue (memory bandwidth, cache, reclaim) counts too. The run-queue p99 is taken over at
  least 200 waits: the latest round's where LS waits often, its latest rounds' together (at most
  5 s) where it waits rarely, so one wild wait in a quiet second does not decide. While slack is 10% or more,
  BE's allowance grows by `slack_grow_percent` of the node per tick (after a whole-BE cut, half the way to
  BE's use when LS missed, then after a wait, doubling each time a probe misses there, by an eighth of a
  step a tick past it: _grow_allowance) up to the whole node, where the
  cap is lifted (`cpu.max` "max"): BE may then take any CPU that LS and the system leave idle at any
  moment, and SCHED_IDLE (qos_baseline) decides who runs; a cap at the average idle CPU would
  leave the dips in LS's demand unused. Between 5% and 10% it holds; under 5% in every round of
  half the experiment window (at least two: one wild sample is no reason) it goes back to the allowance
  LS was last healthy at, where BE uses more than that; else it gives back
  `slack_shrink_percent` of what BE uses (of its allowance, where that is lower), or, on a deep miss (below
  zero in this round and the last, over its target by more than a quarter of it and by more than the
  signal's own noise: _deep_miss), drops to its floor (a cut under way deepens to the floor at a later round
  of a deep miss, once its signal can show the cut: Lab.settled), and stays there until
  the cut is judged (helped early: two rounds back at 10% slack, past the signal's settle time and lag;
  or bought nothing), or for `slack_floor_hold`: if LS
  has not recovered by then, BE is not what it is short of (its own threads contend), and each
  target LS misses is raised to what LS shows at BE's floor plus 25% (so LS at that level has 20%
  slack and BE grows) for 5 minutes, after which it is judged by its declared targets again.
  With no LS signal at all (no sensor, nothing ran yet) it holds what it has, unless the node has no LS
  cgroup at all: then there is nothing to protect, and BE grows as in a healthy round (_without_ls); a round in which a
  class's SLO has no value within 2 s of its last one (neither late nor healthy) holds too, and keeps
  "below zero" from the SLO's last value; an SLO silent for longer leaves the class to its health
  targets, as guards.
  Every cut is an experiment (core/experiment.py, docs/be-control.md): `experiment_window` after a cut (or
  after the floor; later by as far back as the signal's quantile reaches, _lags) the signal it acted on is
  compared with its median over the confirmation span before the cut; a cut that bought no more than the
  signal's noise allows (its spread, the rounds on each side) is undone ("cut bought nothing: runq_p99_us 4.10
  ms -> 4.10 ms") and that lever rests for that signal `lever_rest`, doubling each time in a row, and at least
  long enough that such cuts cost BE at most `experiment_budget_percent` of its CPU time. A cut judged
  helped while its signal is still not healthy is released for one window to test it (A/B/A, _release): put
  back where the release cost latency, else left released, its "helped" retracted, its lever resting. The levers:
  a cap on the busiest BE pods or jobs alone (`hot_cap_percent`, where BE has two or more busy ones: those
  whose CPU use follows the signal, else the busiest, half of them at most), the whole-BE cap (`policy`'s
  knob), and leaving BE alone (cpu.idle decides who runs; what earlier steps left of a cap grows back) when
  every cut rests. What each bought is remembered
  per LS load band, busy BE cgroups and signal; the one that helped there goes first. Leaving BE alone is
  also the control arm (`control_trials`, _control): once the cut has helped 3 times there, one risk in 3 is
  left alone and judged as a cut is, and where LS recovered so as often as the cut helped, BE is left alone
  from then on; where the cut helped more often, but too few verdicts say so clearly (core/experiment.py's
  chance_better under 90%), trials go on one risk in 6. A miss sets the level growth stops short of only where LS begins to miss less often with
  less BE (core/miss_rate.py, _note_miss).
  Before any of them, faster wake-ups (`wake_lever`): koordd holds 0 µs CPU wake-up latency on
  /dev/cpu_dma_latency (the pm_qos backend's `cpu_dma_latency`), so CPUs stay out of deep idle (a VM's vCPU
  does not halt). It takes no CPU from BE, so where the host has the device and a cpuidle driver (without
  one, CPUs idle by a halt no request governs: _wake_can_act) it is tried first, judged
  as a cut is, kept while it helps and also where it bought nothing measurable (a window's verdict cannot
  see the few percent of p99 it buys, and it costs BE nothing: the cuts come next, on top of it) while the
  hypervisor took under 5 ms a second from a vCPU over its window (where the host takes time back, polling
  vCPUs make it take more, at a cost to LS one window cannot see either: _steal_rate), released where LS
  was worse with it by more than the margin (Verdict.cost; it then rests as a cut's lever does),
  and once the steering slack has been 10% or more for 6 experiment windows in a row
  (30 s by default: not on the first good round, which it may have bought), when turned off, and at stop;
  if koordd dies the kernel drops the request with its file descriptor.
  Where the hypervisor takes busy vCPUs away (steal of 50 ms or more in a round, a stall no per-miss cut can
  answer: it is over before the cut lands) while LS is at risk (by its SLO where it declares one), a standing
  headroom (`steal_headroom_percent`, core/headroom.py) holds BE's allowance under the node less that share,
  less LS's and the system's peak, as a trial of minutes judged by counting stolen rounds and rounds with LS
  at risk: kept for a while where both fell, else undone and resting.
  Where a class declares an SLO its application latency steers; its run-queue latency and pressure
  only guard: over their targets while the SLO is met (or silent for over 2 s) they hold BE's growth
  and may cut once, by `slack_shrink_percent`; holding and cutting together last `guard_cut_max` at
  most, then the SLO decides and the guard rests as long, twice as long after each such episode in a row
  that the SLO stayed met through (at most 16 times; the SLO at risk starts it over); never to the floor,
  and not at all while BE is at its floor (what a proxy sees then is LS's own).
- "threshold" (koordlet's rule), described next.

Reads: node CPU in use, CPU usage of every classified cgroup, `cpu.pressure`
of the LS, LSR and LSE cgroups, and the BE cgroups' current `cpu.max` /
`cpuset.cpus`.

Decides: BE allowance (cores) = CPUs × threshold_percent − non-BE usage −
system usage, where system usage is the node's busy time not inside any
classified cgroup, at least `reserved_cpus`. Non-BE plus system usage is the
peak over `usage_window`, so a short LS spike is not forgotten the next tick.
When an LS cgroup's `cpu.pressure` "some" avg10 exceeds `psi_guard_percent`,
BE shrinks by `psi_guard_shrink_percent` of its current limit every tick,
even if the usage rule would allow more. BE shrinks at once and grows by at
most 10% of the node per tick.

Writes, on the cgroups of class BE (each gets an equal share), except those holding a cgroup of
another class (an LS job in be.slice) or lying inside one: capping them would cap that work, so a
cap this loop holds there is lifted, and their own usage counts as the system's:
- policy "cfs_quota": `cpu.max` quota = share × period (at least 2000 µs);
  changes under 1% of the node are skipped.
- policy "cpuset": `cpuset.cpus` = ceil(allowance) CPUs (at least 2), whole SMT
  siblings first, spread over NUMA nodes, never the CPUs of LSE cgroups.
Switching policy puts the other knob back to its original value; disabling the
loop or stopping koordd restores both.

Antagonists (off by default; `antagonist_signal = "runq"` or `"cpi"`), in CPI2's
manner: each LS, LSR and LSE cgroup's signal (run-queue latency p99, or the mean
where only schedstat is there; or cycles per instruction) has a baseline, the
mean and σ over `antagonist_window`. A tick whose signal is above mean + 2σ
while the cgroup uses at least `antagonist_min_cpus` is an outlier;
`antagonist_outliers` of them within the window make it a victim. The suspect
is the BE cgroup (a pod or job below a BE root) whose CPU use correlates best
with the victim's signal over the window (Pearson, at least 0.3). It gets a
`cpu.max` of `antagonist_cap_cpus` for `antagonist_cap_duration`, then its own
value back; the decision's reason holds the evidence (signal, baseline,
outliers, correlation). A cap found in the journal after a restart or reload,
whose timer is lost, is lifted at once.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from koordd.core.cgroup_text import CFS_QUOTA_MIN, MAX_CPUS, format_cpu_max, format_cpulist, parse_cpu_max, parse_cpulist
from koordd.core.classes import NON_BE
from koordd.core.experiment import (BUSY_CORES, LEAVE, History, Lab, Record, Verdict, chance_better, conditions,
                                    show_value)
from koordd.core.headroom import STOLEN_MS, Event, Headroom
from koordd.core.health import (LATENCY_SENSITIVE, SLO_QUANTILES, SLO_SIGNALS, SOCKET_FULL, RunqWindow, ls_signals,
                                worst_slack)
from koordd.core.slo import SloWindow
from koordd.core.interference import Detector, pearson
from koordd.core.miss_rate import Blame, MissLedger
from koordd.core.loop import NODE, Action, Loop, restore
from koordd.core.options import Duration, Option
from koordd.core.protected import Protected
from koordd.core.snapshot import CPI, CgroupSample, CpuTopology, RUNQ_LATENCY, Snapshot, own_usage

MIN_QUOTA_US = 2000          # koordlet's floor: BE keeps a trickle so it can still make progress
MIN_CPUSET_CPUS = 2
GROW_FRACTION = 0.10         # of the node, per tick
SKIP_FRACTION = 0.01         # of the node: smaller quota changes are noise
DEFAULT_PERIOD_US = 100_000
MIN_CORRELATION = 0.3        # a suspect's CPU use must follow the victim's signal at least this well
SIGNAL_SECTIONS = {"runq": RUNQ_LATENCY, "cpi": CPI}
# The levers of rule slack: a cap on the busiest BE cgroups alone, the whole-BE cap (the policy's knob),
# and leaving BE alone (cpu.idle, qos_baseline's, decides who runs): core/experiment.py judges each cut.
HOT_CAP, BE_CAP = "hot_cap", "be_cap"
# Faster wake-ups: koordd's request of 0 µs CPU wake-up latency (the pm_qos backend's knob on the node), which
# keeps CPUs out of deep idle while held. It takes no CPU from BE: tried before any cut (_wake_lever).
WAKE, WAKE_KNOB = "wake", "cpu_dma_latency"
WAKE_CALM_WINDOWS = 6        # released once LS's slack was 10% or more for this many experiment windows
LEVERS = (WAKE, HOT_CAP, BE_CAP, LEAVE)
# cpu.pressure's avg10 is an exponential average the kernel updates every 2 s with a 10 s time constant: a
# step shows 39% of its size 5 s on and 63% after 10 s. Judged 5 s after a cut (the window), a cut that
# halved LS's stalls read as a third of that; from 10 s on it shows enough to be judged.
PSI_AVG10_LAG = 10.0


@dataclass
class State:
    demand: deque = field(default_factory=deque)     # (time, non-BE + system cores)
    allowance: float | None = None                   # rule slack: BE's CPUs, moved by slack each tick
    at_floor: bool = False                           # rule slack: slack went below zero; held until 10%
    below_zero: bool = False                         # rule slack: last round's slack was below zero
    floor_since: float = 0.0                         # rule slack: when BE went to its floor
    raised: dict = field(default_factory=dict)       # rule slack: (cgroup, signal) -> (target, until)
    runq: RunqWindow = field(default_factory=RunqWindow)   # rule slack: recent rounds' waits per LS cgroup
    slo: SloWindow = field(default_factory=SloWindow)      # rule slack: recent rounds' responses per SLO
    detector: Detector | None = None                 # antagonists: baselines, outliers, BE CPU series
    capped: dict[str, float] = field(default_factory=dict)   # BE cgroup capped as an antagonist -> until
    lab: Lab | None = None                           # rule slack: every cut an experiment (core/experiment.py)
    guard_cut: tuple | None = None                   # rule slack: a guard's cut: (until, allowance before, signal)
    guard_since: float | None = None                 # rule slack: since when a guard holds or cuts BE (the SLO met)
    guard_off_until: float = 0.0                     # rule slack: a guard that held guard_cut_max rests until then
    guard_rest_times: int = 1                        # rule slack: the guard's next rest, in guard_cut_max (_guard_rest)
    slo_seen: dict[str, float] = field(default_factory=dict)   # rule slack: class root -> its SLO's last value's time
    hot: dict[str, str] = field(default_factory=dict)        # rule slack: BE cgroup under a hot cap -> cpu.max
    be_cpu: History = field(default_factory=lambda: History(60.0))   # rule slack: BE cgroups' CPU, to attribute
    wake: bool = False                               # rule slack: the wake lever's request is held
    wake_calm: float | None = None                   # rule slack: since when LS is healthy while it is held
    steal: History = field(default_factory=lambda: History(60.0))   # rule slack: rounds' worst vCPU steal, ms
    members_read: bool = True                        # rule slack: read BE pods' CPU next round (hot caps may matter)
    headroom: Headroom = field(default_factory=Headroom)   # rule slack: the standing headroom (core/headroom.py)
    missed_at: float | None = None                   # rule slack: BE's CPU use when LS last missed, cut for it
    healthy_at: float | None = None                  # rule slack: BE's allowance in LS's last healthy round
    probe_at: float = 0.0                            # rule slack: BE grows past missed_at from then on
    dwell: float = 0.0                               # rule slack: how long it waited there last time
    unshowable_rounds: int = 0                       # rule slack: rounds that held BE as no cut could show
    missed_band: int | None = None                   # rule slack: LS's load band (fifths of the node) at the miss
    risks_since_control: int = 0                     # rule slack: confirmed risks since the last left alone (_control)
    misses: dict[int, MissLedger] = field(default_factory=dict)   # rule slack: load band -> how often LS
                                                     # begins to miss at each BE level (core/miss_rate.py)


class BeSuppress(Loop):
    __doc__ = __doc__
    name = "be_suppress"
    options = (
        Option("rule", str, "slack", "what sizes BE: slack (LS health, Heracles' rule) or threshold (koordlet's "
               "usage rule)", choices=("slack", "threshold")),
        Option("threshold_percent", float, 65.0, "node CPU share that LS + system + BE may use together",
               min=1, max=100),
        Option("policy", str, "cfs_quota", "how BE is capped: cfs_quota (cpu.max) or cpuset (cpuset.cpus)",
               choices=("cfs_quota", "cpuset")),
        Option("reserved_cpus", float, 0.0, "CPUs always counted as used by the system", min=0,
               max=MAX_CPUS),
        Option("usage_window", Duration, Duration(3.0), "peak LS + system usage is taken over this window",
               min=0, max=600),
        Option("psi_guard_percent", float, 40.0,
               "LS cpu.pressure some avg10 above which BE shrinks further; 0 turns the guard off", min=0, max=100),
        Option("psi_guard_shrink_percent", float, 20.0, "how much of its limit BE loses per tick under pressure",
               min=1, max=90),
        Option("slack_shrink_percent", float, 30.0, "rule slack: how much of what it uses (or of its allowance, "
               "where lower) BE gives back at once when slack is under 5% and the miss is not deep enough for the "
               "floor", min=1, max=100),
        Option("slack_floor_hold", Duration, Duration(10.0), "rule slack: how long BE stays at its floor for LS "
               "to recover before koordd decides BE is not the cause and raises the targets to what LS shows",
               min=1, max=3600),
        Option("slack_grow_percent", float, 25.0, "rule slack: how much of the node BE's allowance gains per tick "
               "while slack is 10% or more", min=1, max=100),
        Option("experiment_window", Duration, Duration(5.0), "rule slack: how long after a cut the LS signal it "
               "acted on is judged; a cut that bought no more than the signal's noise is undone", min=1, max=600),
        Option("lever_rest", Duration, Duration(10.0), "rule slack: how long a lever whose cut bought nothing "
               "rests for that signal, doubling each time in a row (up to 32 times this)", min=1, max=3600),
        Option("experiment_budget_percent", float, 10.0, "rule slack: the share of BE's CPU time that cuts which "
               "bought nothing may cost: after one, its lever rests at least long enough to keep to it (a 6 s floor "
               "rests 54 s at 10%)", min=1, max=100),
        Option("guard_cut_max", Duration, Duration(30.0), "rule slack: where a class's SLO is met, the longest its "
               "run-queue latency or pressure alone holds or cuts BE (then it rests as long, doubling each time in "
               "a row the SLO stayed met, up to 16 times)", min=1, max=3600),
        Option("wake_lever", bool, True, "rule slack: a lever that asks the kernel for 0 µs CPU wake-up latency "
               "(/dev/cpu_dma_latency: CPUs stay out of deep idle) while LS is at risk, tried before any cut, kept "
               "unless LS is worse with it or, where it bought nothing measurable, the hypervisor took 5 ms a second "
               "or more from a vCPU while it was held; false turns it off. Never tried where the host has no cpuidle "
               "driver: no request changes how CPUs idle there"),
        Option("control_trials", int, 3, "rule slack: once the best cut has helped 3 times for a load band and "
               "signal, one risk in 3 is left alone for a window and judged as a cut is, this many times; then BE is "
               "left alone wherever LS recovered so as often as the cut helped, and where the cut helped more often "
               "but with a chance under 90% of being the better, one risk in 6 is tried so, up to 4 times this in "
               "all; 0 turns it off (every risk is cut)",
               min=0, max=100),
        Option("hot_cap_percent", float, 50.0, "rule slack: a lever that caps the busiest BE cgroups (pods, jobs) "
               "alone, to this much less than they use; 0 turns it off", min=0, max=95),
        Option("steal_headroom_percent", float, 10.0, "rule slack: where the hypervisor takes busy vCPUs away "
               "(steal of 50 ms or more in a round) while LS is at risk, seen over 5 minutes, a trial of minutes "
               "holds BE to this share of the node less than LS and the system leave; kept while it buys fewer "
               "stalls and rounds at risk, else undone and resting; 0 turns it off", min=0, max=50),
        Option("antagonist_signal", str, "off", "cap the BE cgroup that interferes with LS, judged by: off, "
               "runq (run-queue latency) or cpi (cycles per instruction)", choices=("off", "runq", "cpi")),
        Option("antagonist_window", Duration, Duration(300.0), "baseline and correlation window", min=10, max=3600),
        Option("antagonist_outliers", int, 3, "outliers within the window that make an LS cgroup a victim",
               min=1, max=1000),
        Option("antagonist_min_cpus", float, 0.25, "an LS cgroup using less CPU is never a victim", min=0,
               max=MAX_CPUS),
        Option("antagonist_cap_cpus", float, 0.01, "the suspect's cpu.max while capped, in CPUs", min=0.01,
               max=MAX_CPUS),
        Option("antagonist_cap_duration", Duration, Duration(300.0), "how long a suspect stays capped",
               min=1, max=86400),
    )

    @staticmethod
    def writes(settings) -> frozenset[tuple[str, str]]:
        knob = "cpu.max" if settings.policy == "cfs_quota" else "cpuset.cpus"
        members = _antagonists_on(settings) or _hot_cap_on(settings)
        wake = {(NODE, WAKE_KNOB)} if _wake_on(settings) else set()
        return frozenset({("BE", knob)} | ({("BE", "cpu.max")} if members else set()) | wake)

    @staticmethod
    def needs(settings) -> frozenset[str]:
        out = {"cpu_usage", "cpu_pressure", "cpu_max" if settings.policy == "cfs_quota" else "cpuset_cpus"}
        if _antagonists_on(settings):
            out.add(SIGNAL_SECTIONS[settings.antagonist_signal])
        if settings.rule == "slack":
            out.add(RUNQ_LATENCY)
        return frozenset(out)

    @staticmethod
    def members_of(settings) -> frozenset[str]:
        # suspects and hot caps are pods or jobs
        return frozenset({"BE"}) if _antagonists_on(settings) or _hot_cap_on(settings) else frozenset()

    @staticmethod
    def member_needs(settings) -> frozenset[str]:
        return frozenset({"cpu_usage"})

    @staticmethod
    def member_fields(snapshot: Snapshot, settings, state: State) -> frozenset[str]:
        """BE pods' CPU use is read every round where antagonists are judged (their baselines need every
        round); for hot caps only while one may be cut or is held (LS near or over a target, a cut being
        judged, a hot cap on: `State.members_read`). A healthy node with hundreds of BE pods lists them
        instead of reading each one's usage file (about 4.5 ms of CPU a second at 250 pods); the CPU history
        the hot cap ranks pods by then skips those rounds, and the correlation pairs only rounds with both."""
        if _antagonists_on(settings) or state.members_read or state.hot:
            return frozenset({"cpu_usage"})
        return frozenset()

    @staticmethod
    def initial_state(settings) -> State:
        return State()

    @staticmethod
    def report(settings, state: State) -> dict:
        """Rule slack: what each lever bought (core/experiment.py's Lab.status), for status.json and metrics."""
        if settings.rule != "slack" or state.lab is None:
            return {}
        return {"hot_caps": dict(sorted(state.hot.items())), "wake_held": state.wake,
                "unshowable_rounds": state.unshowable_rounds,
                "headroom": state.headroom.fields(None, state.lab.now), "levels": _levels(state),
                **state.lab.status(state.lab.now, LEVERS)}

    @staticmethod
    def decide(snapshot: Snapshot, settings, state: State) -> list[Action]:
        actions = _allowance_actions(snapshot, settings, state)
        if _antagonists_on(settings):
            caps = _antagonist_actions(snapshot, settings, state)
            # An antagonist's cap supersedes a hot cap on the same pod: one action per knob.
            taken = {a.target for a in caps}
            for cg in taken & set(state.hot):
                del state.hot[cg]
            actions = [a for a in actions if not (a.knob == "cpu.max" and a.target in taken)] + caps
        return actions


def _levels(state: State) -> dict:
    """What growth remembers (_grow_allowance), for status.json: BE's CPU use at LS's last miss, the allowance
    LS was last healthy at, and the seconds left before BE probes past the miss."""
    def cores(v):
        return None if v is None else round(v, 3)
    wait = None if state.missed_at is None else round(max(state.probe_at - state.lab.now, 0.0), 1)
    return {"missed_at_cores": cores(state.missed_at), "healthy_at_cores": cores(state.healthy_at),
            "probe_in_s": wait}


def _antagonists_on(settings) -> bool:
    return settings.antagonist_signal != "off"


def _hot_cap_on(settings) -> bool:
    return settings.rule == "slack" and settings.hot_cap_percent > 0


def _wake_on(settings) -> bool:
    return settings.rule == "slack" and settings.wake_lever


def _allowance_actions(snapshot: Snapshot, settings, state: State) -> list[Action]:
    be, lifted = _cappable(snapshot)
    non_be = own_usage(snapshot, snapshot.of_class(*NON_BE))
    be_used = own_usage(snapshot, be)
    node_used = snapshot.node.cpu_used
    if not be or non_be is None or be_used is None or node_used is None:
        return lifted   # first tick or a sensor is blind: hold the current limits
    return lifted + _sized_actions(snapshot, settings, state, be, non_be, be_used, node_used)


def _cappable(snapshot: Snapshot) -> tuple[tuple[CgroupSample, ...], list[Action]]:
    """The BE roots this loop may cap, and the lifting of any cap it holds on the others: those that
    hold an LS, LSR, LSE or SYSTEM cgroup (an LS job in be.slice) or lie inside one. Capping them would
    cap that work; their own usage counts as the system's, which BE's allowance leaves room for."""
    guard, be, lifted = Protected.of_snapshot(snapshot), [], []
    for c in snapshot.of_class("BE"):
        why = guard.why(c.path)
        if why is None:
            be.append(c)
            continue
        lifted += [restore(c.path, knob, f"{c.path} {why}: not capped", step="protected")
                   for knob in ("cpu.max", "cpuset.cpus")]
    return tuple(be), lifted


def _sized_actions(snapshot: Snapshot, settings, state: State, be, non_be: float, be_used: float,
                   node_used: float) -> list[Action]:
    capacity = snapshot.node.cpu_count
    system = max(node_used - non_be - be_used, settings.reserved_cpus, 0.0)
    if settings.rule == "slack":
        sized = _slack_allowance(snapshot, settings, state, be, capacity, non_be + system, be_used)
        if sized is None:
            return []       # no LS signal yet: hold the current limits
        allowance, reason, why, extra = sized
        # The allowance moved at the rule's own pace already: the knob follows it in one step. Every verdict
        # is on record, also where it leaves the knobs as they are (a cut that helped stays, a release that
        # cost nothing stays released): said (KEPT) with its verdict, though nothing is written.
        said = reason.pop("say", False)          # the headroom started, was judged or ended (_headroom)
        judged = "verdict" in (reason.get("experiment") or {}) and not any(
            "verdict" in (a.reason.get("experiment") or {}) for a in extra)
        limits = _limit_actions(snapshot, settings, be, Sizing(capacity, allowance, False, reason, why, grow=1.0,
                                                               say=judged or said))
        if judged:
            extra = [replace(a, say=True, reason={**a.reason, "experiment": reason["experiment"]})
                     if a.value is not None else a for a in extra]
        return extra + limits
    demand = _windowed_peak(state.demand, snapshot.time, non_be + system, settings.usage_window)
    allowance = max(capacity * settings.threshold_percent / 100 - demand, 0.0)
    pressure = _peak_pressure(snapshot.of_class(*LATENCY_SENSITIVE))
    guard = settings.psi_guard_percent > 0 and pressure is not None and pressure > settings.psi_guard_percent
    reason = {"capacity": capacity, "threshold_percent": settings.threshold_percent,
              "non_be_usage": round(non_be, 3), "system_usage": round(system, 3),
              "demand_peak": round(demand, 3), "be_usage": round(be_used, 3),
              "allowance": round(allowance, 3), "ls_cpu_pressure_avg10": pressure, "psi_guard": guard}
    why = (f"BE allowance {allowance:.2f} of {capacity} CPUs = {settings.threshold_percent:g}% "
           f"- LS/system peak {demand:.2f}" + (f"; LS cpu pressure {pressure:.1f}% > "
                                                f"{settings.psi_guard_percent:g}%, shrinking" if guard else ""))
    return _limit_actions(snapshot, settings, be, Sizing(capacity, allowance, guard, reason, why))


GROW_AT, HOLD_AT = 0.10, 0.05     # Heracles: grow BE at 10% slack or more, give back under 5%
FLOOR_MISS = 0.25                 # the floor only for a miss over the target by more than this share of it (_deep_miss)
RAISE_MARGIN = 1.25               # a raised target: what LS showed at BE's floor, plus 25% (20% slack there)
RAISED_FOR = 300.0                # seconds; then LS is judged by its declared targets again
STEAL_SAID_MS = 20.0              # a round's steal the decision's sentence names: a stall the guest saw nowhere else
WAKE_KEEP_STEAL_MS = 5.0          # ms a second the host may take from a vCPU for the wake request to stay unproven
STEAL = "steal_ms"                # State.steal's key: the round's steal of the vCPU that lost the most
SLO_GAP = 2.0                     # seconds: a round this soon after the SLO's last value lies between two values
CREEP_STEPS = 8                   # past the BE use at which LS last missed, BE grows by this fraction of a step
DWELL_FIRST, DWELL_MAX = 10.0, 320.0   # seconds BE waits near where LS missed before probing past it, doubling
GUARD_REST_TIMES = 16             # a guard rests at most this many times guard_cut_max (_guard_rest)
# The control arm (_control): once the best cut has helped CONTROL_AFTER times for a load band and signal, one
# confirmed risk in CONTROL_EVERY is left alone and judged as a cut is, up to `control_trials` such trials;
# from then on BE is left alone wherever LS recovered left alone as often as the cut helped. Where the cut
# helped more often, but not with a chance of CONTROL_CLEAR that it is the better (core/experiment.py's
# chance_better), trials go on one risk in 2 x CONTROL_EVERY, up to CONTROL_MORE x `control_trials` in all.
CONTROL_AFTER, CONTROL_EVERY = 3, 3
CONTROL_CLEAR, CONTROL_MORE = 0.9, 4


def _split(snapshot: Snapshot, signals: list) -> tuple[list, list]:
    """(steering, guarding) signals. Where a class declares an SLO, its application latency steers and its
    run-queue latency and pressure only guard (a stall the SLO cannot see yet); a class without an SLO is
    steered by them."""
    steer, guard = [], []
    for sig in signals:
        (steer if sig[1] in SLO_SIGNALS or snapshot.slo_of(sig[0]) is None else guard).append(sig)
    return steer, guard


@dataclass(frozen=True)
class SlackRound:
    """One round of rule slack as read, before any step: what the steps decide on. `steer` and `guard`: the
    worst steering and guarding slack with what set it (worst_slack), or None; `below`: the last round's slack
    was below zero; `between`: class roots whose SLO has no value this round but had one within SLO_GAP;
    `guarding`: a guard signal is there and not resting."""
    now: float
    capacity: int
    others: float                    # LS and system cores
    be_used: float
    floor: float                     # BE's floor, in cores
    signals: list
    steer: tuple | None
    guard: tuple | None
    units: dict                      # the BE cgroups a hot cap may take -> their CPU use
    below: bool
    between: list
    guarding: bool
    steal_ms: float | None = None    # the round's steal of the vCPU that lost the most (NodeSample.steal_worst), ms

    @property
    def s(self) -> float | None:
        return self.steer[0] if self.steer is not None else None

    @property
    def g(self) -> float | None:
        return self.guard[0] if self.guard is not None else None

    def conditions(self, signal: str) -> tuple:
        """The conditions a cut for `signal` is judged and remembered under (core/experiment.py)."""
        return conditions(self.others, self.capacity, [p for p, c in self.units.items() if c >= BUSY_CORES], signal)


def _slack_allowance(snapshot: Snapshot, settings, state: State, be, capacity: int, others: float,
                     be_used: float) -> tuple[float, dict, str, list[Action]] | None:
    """BE's CPUs moved by LS slack (rule slack), every cut an experiment (core/experiment.py): grow towards
    the whole node, hold, cut with the lever that bought most under these conditions, undo a cut that
    bought nothing, drop to the floor. Also the hot caps' and the wake lever's actions. None: no LS signal."""
    now = snapshot.time
    lab = _slack_lab(settings, state)
    raised = _raised_targets(state, now)
    signals = ls_signals(snapshot, snapshot.section(RUNQ_LATENCY), state.runq, state.slo)
    steer_signals, guard_signals = _split(snapshot, signals)
    steer, guard = worst_slack(steer_signals, raised), worst_slack(guard_signals, raised)
    units, extra = _hot_units(snapshot, settings, state)
    state.members_read = _members_matter(state, steer, guard)
    if steer is None and guard is None:
        return _without_ls(snapshot, settings, state, capacity)
    if state.allowance is None:
        state.allowance = _allowance_held(settings, be, capacity)
    allowance, running = state.allowance, lab.running          # as the round found them
    values, healthy = _readings(signals, raised)
    steal = snapshot.node.steal_worst
    if steal is not None:
        state.steal.add(now, STEAL, steal * 1000)       # for the wake lever's verdict (_steal_rate)
    verdict = lab.observe(now, values, be_used, healthy, _lags(state, values))
    below = state.below_zero             # the last round's: this round's is noted next
    between = _note_slo_rounds(snapshot, state, signals, steer)
    guarding = _guard_clock(settings, state, steer, guard, now)
    rd = SlackRound(now, capacity, others, be_used, len(be) * MIN_QUOTA_US / DEFAULT_PERIOD_US, signals, steer,
                    guard, units, below, between, guarding, None if steal is None else round(steal * 1000, 1))

    _forget_stale_miss(state, rd)
    _note_round(settings, state, rd)
    experiment = verdict.fields() if verdict is not None else None
    lapsed = lab.lapsed(now) if verdict is None else None
    if verdict is not None:
        step, undone = _verdict_step(settings, state, verdict, running, experiment, healthy, units)
        extra += undone
    elif lapsed is not None:
        step, undone = _lapsed_step(state, lapsed)
        extra += undone
    else:
        step = _guard_cut_over(settings, state, now)
    if not any(a.knob == WAKE_KNOB for a in extra):       # not in the round of its verdict
        extra += _wake_upkeep(snapshot, settings, state, rd.s if rd.s is not None else rd.g)
    if step is None:
        step, moved = _choose_step(snapshot, settings, state, rd)
        extra += moved
    headroom = _headroom(settings, state, rd)
    state.allowance = max(state.allowance, rd.floor)
    if state.allowance != allowance or any(a.value is None or a.reason.get("step") != "hold" for a in extra):
        lab.moved()
    if lab.running is not None and experiment is None:
        experiment = lab.running.fields()
    reason, why = _slack_reason(state, rd, step, experiment, headroom)
    extra += _holds(state, extra)
    state.members_read = _members_matter(state, steer, guard)
    return state.allowance, reason, why, extra


def _without_ls(snapshot: Snapshot, settings, state: State, capacity: int):
    """No LS signal this round. Where the node has LS cgroups the sensors are blind (nothing measured yet, a
    sensor gone): hold what BE has (None). Where it has none, there is nothing to protect: a running cut ends
    without a verdict and goes back, hot caps are lifted, the wake lever's request is released, and BE grows
    as in a healthy round. Before, BE kept the cap of the last LS service's last round for as long as no LS
    cgroup came back, and the CPUs stayed out of deep idle."""
    if state.allowance is None or snapshot.of_class(*LATENCY_SENSITIVE):
        return None
    step = "grow: no LS cgroup on the node, nothing to protect"
    extra = []
    running = state.lab.abandon()
    if running is not None:
        extra += _undo_actions(state, running, step, running.fields())
    extra += _lift_hot(state, "no LS cgroup on the node") + (
        _wake_release(state, "no LS cgroup on the node") if state.wake else [])
    state.guard_cut, state.below_zero, state.guard_rest_times = None, False, 1     # the next LS starts anew
    state.misses = {}
    _grow(settings, state, capacity)
    _forget_levels(state)
    state.lab.moved()
    reason = {"rule": "slack", "step": step, "capacity": capacity, "allowance": round(state.allowance, 3)}
    why = f"{step}: BE may use {state.allowance:.2f} of {capacity} CPUs"
    released = state.headroom.abandon("no LS cgroup on the node")
    if released is not None:
        reason |= {"headroom": state.headroom.fields(None, snapshot.time), "say": True}
        why += f"; {released.text}"
    return state.allowance, reason, why, extra


def _members_matter(state: State, steer, guard) -> bool:
    """Whether next round needs BE pods' CPU use: a hot cap may be cut (a signal under 10% slack), is being
    judged, or is held."""
    near = any(x is not None and x[0] < GROW_AT for x in (steer, guard))
    return near or bool(state.hot) or (state.lab is not None and state.lab.running is not None)


def _choose_step(snapshot: Snapshot, settings, state: State, rd: SlackRound) -> tuple[str, list[Action]]:
    """The round's step where no verdict or end of a guard's cut decided it, the first that applies: a cut
    (the steering slack under 5%; a guard's cut then ends, the SLO decides), wait for a running cut's verdict,
    hold between two SLO values, a guard's bounded cut, stay at the floor, hold, hold for a guard, else grow.
    Returns it with its actions."""
    s, g, running = rd.s, rd.g, state.lab.running
    # A guard neither holds nor cuts BE at its floor: the stall it sees with BE at 2% of a CPU is LS's own, and
    # holding BE there while the SLO is met is the floor the SLO did not ask for.
    guarding = rd.guarding and state.allowance > rd.floor
    if s is not None and s < HOLD_AT:
        if state.guard_cut is not None:
            # a guard's cut, and now the SLO itself is at risk: the guard's cut ends and the guard rests, but BE
            # keeps the cut (an SLO at risk is no reason to give BE more; on 2 CPUs, redis against the memory
            # antagonist, BE had its CPU back for the 2 s the SLO's own cut took to confirm), and the SLO
            # decides from here (a cut of its own once confirmed)
            _end_guard_cut(settings, state, rd.now, give_back=False)
        return _steer_cut(snapshot, settings, state, rd)
    if running is not None and running.bound is None:
        return ("floor (LS recovering)" if state.at_floor else f"hold: judging {_what(running)}"), []
    if rd.between and (s is None or s < GROW_AT):
        return f"hold: no SLO value this round for {', '.join(rd.between)} (neither late nor healthy)", []
    if guarding and g < 0:
        return _guard_cut(settings, state, rd), []
    if state.at_floor and (s is None or s < GROW_AT):
        return "floor (LS recovering)", []
    if s is not None and s < GROW_AT:
        return "hold", []
    if guarding and g < HOLD_AT:
        return "hold (guard: LS's run queue or pressure near its target)", []
    return _grow(settings, state, rd.capacity)


def _grow(settings, state: State, capacity: int) -> tuple[str, list[Action]]:
    """LS is healthy: BE leaves its floor, its hot caps are lifted, and it gains slack_grow_percent of the node
    (less near where LS last missed: _grow_allowance). The allowance it was healthy at is remembered."""
    state.at_floor = False
    lifted = _lift_hot(state, "LS healthy again") if state.hot else []
    state.healthy_at = state.allowance
    return _grow_allowance(settings, state, capacity), lifted


def _grow_allowance(settings, state: State, capacity: int) -> str:
    """BE's allowance gains slack_grow_percent of the node, up to the whole node. Below the BE use at which LS
    last missed (missed_at: a whole-BE cut not found useless), half the way to it; within an eighth of a step
    of it, nothing until probe_at, then an eighth of a step a round past it, until a whole step past it with
    no miss forgets it. Returns the step as the decision says it.

    Why: on 16 CPUs (membw, 2026-11-29) one step from the floor was 4 CPUs, past where LS missed. BE went
    floor, 4 CPUs, a miss, a shrink, the floor again, and at 3 x LS alone it held BE at the floor while a
    static 4.2-CPU cap kept the run's p99 under the target with 33% of BE's work. Bisecting towards the miss,
    waiting before probing past it (longer each time it misses there again) and creeping settles BE just
    under the level LS tolerates; a level that moved (less LS load) is found again, eight rounds a step."""
    step = settings.slack_grow_percent / 100 * capacity
    missed, allowance = state.missed_at, state.allowance
    if missed is not None and allowance >= missed + step:
        state.missed_at = missed = None
    said = "grow"
    if missed is not None:
        creep = step / CREEP_STEPS
        now = state.lab.now
        if allowance < missed - creep:
            step = min(step, max((missed - allowance) / 2, creep))
            said = f"grow towards {missed:.2f} CPUs (where LS last missed)"
        elif now < state.probe_at:
            step = 0.0
            said = f"hold near {missed:.2f} CPUs, where LS last missed, {state.probe_at - now:.0f}s more before probing"
        else:
            step = creep
            said = f"grow past {missed:.2f} CPUs (where LS last missed) by {creep:.2f} a round"
    state.allowance = min(float(capacity), allowance + step)
    return said


def _headroom(settings, state: State, rd: SlackRound) -> tuple[Event | None, float]:
    """The standing headroom (core/headroom.py): note the round, and while it is held keep BE's allowance
    under its ceiling, the node less steal_headroom_percent of it less LS's and the system's peak over
    usage_window (a ceiling that followed each round's LS use would move the quota every round). Returns the
    round's change of phase (or None) and the ceiling."""
    share = 1 - settings.steal_headroom_percent / 100
    ceiling = rd.capacity * share - _windowed_peak(state.demand, rd.now, rd.others, settings.usage_window)
    hr = state.headroom
    if settings.steal_headroom_percent <= 0:
        return hr.abandon("steal_headroom_percent is 0"), ceiling
    if rd.steal_ms is None:           # the first round, or the CPUs changed: nothing to count
        return hr.abandon("steal unknown this round (the node's CPUs changed)"), ceiling
    # At risk: the steering slack under 5%, where the loop itself would cut. A guard's word does not count: a
    # trial holds BE for minutes, and a guard may only hold or cut it for guard_cut_max (redis against memory on
    # 2 CPUs: the run queue's 2.05 ms of 2, before the SLO's first value, began a trial that held BE to 1.00 of
    # 2 CPUs through a window in which the SLO had 60% slack).
    at_risk = rd.s is not None and rd.s < HOLD_AT
    event = hr.observe(rd.now, rd.steal_ms >= STOLEN_MS, rd.be_used > ceiling, at_risk)
    if hr.held:
        state.allowance = min(state.allowance, ceiling)
    return event, ceiling


def _slack_reason(state: State, rd: SlackRound, step: str, experiment: dict | None,
                  headroom: tuple[Event | None, float]) -> tuple[dict, str]:
    """The reason and the sentence that go with each of the round's actions on BE's knob. A round that starts,
    judges or ends the headroom is on record even where BE's knob does not move (`say`)."""
    slack, worst = rd.steer if rd.steer is not None else rd.guard
    idle = max(rd.capacity - rd.others, 0.0)
    reason = {"rule": "slack", "slack": round(slack, 3), "worst": worst, "step": step, "capacity": rd.capacity,
              "raised_targets": {f"{cg} {name}": round(t, 3) for (cg, name), (t, _) in sorted(state.raised.items())},
              "ls_and_system_usage": round(rd.others, 3), "idle_for_be": round(idle, 3),
              "allowance": round(state.allowance, 3), "be_usage": round(rd.be_used, 3),
              "guard": {"slack": round(rd.g, 3), **rd.guard[1]} if rd.guard is not None and rd.steer is not None
              else None,
              "experiment": experiment, "steal_worst_ms": rd.steal_ms}
    event, ceiling = headroom
    if event is not None or state.headroom.held:
        reason["headroom"] = state.headroom.fields(ceiling, rd.now)
    if event is not None:
        reason["say"] = True
    said = f"{worst['cgroup']} {worst['signal']} {worst['value']:g} of {worst['target']:g}"
    if worst["signal"] == SOCKET_FULL and slack < 0:
        said += " of its responses sent on a full socket: its clients wait where the kernel cannot time them"
    why = f"LS slack {slack:.0%} ({said}): {step}, BE allowance {state.allowance:.2f} of {rd.capacity} CPUs " \
          f"({idle:.2f} idle)"
    if rd.steal_ms is not None and rd.steal_ms >= STEAL_SAID_MS:
        why += f"; the hypervisor held a vCPU off for {rd.steal_ms:.0f} ms this round (steal)"
    if event is not None:
        why += f"; {event.text}"
    elif state.headroom.held:
        why += f" (headroom {state.headroom.phase}: at most {max(ceiling, 0):.2f})"
    return reason, why


def _holds(state: State, moved: list[Action]) -> list[Action]:
    """A hold for each lever still held that the round's actions (`moved`) do not move: the hot caps and the
    wake lever's request."""
    out = [Action(cg, "cpu.max", value, {"rule": "slack", "lever": HOT_CAP, "step": "hold"},
                  f"hot cap on {cg} holds") for cg, value in sorted(state.hot.items())
           if not any(a.target == cg for a in moved)]
    if state.wake and not any(a.knob == WAKE_KNOB for a in moved + out):
        out.append(Action(NODE, WAKE_KNOB, "0", {"rule": "slack", "lever": WAKE, "step": "hold"},
                          "CPU wake-up latency request (0 µs) holds"))
    return out


def _slack_lab(settings, state: State) -> Lab:
    """The loop's experiments (core/experiment.py), made on its first round of rule slack."""
    if state.lab is None:
        window = float(settings.experiment_window)
        state.lab = Lab(window=window, settle=0.4 * window, rest=float(settings.lever_rest),
                        rest_max=32 * float(settings.lever_rest), budget=settings.experiment_budget_percent / 100)
    return state.lab


def _raised_targets(state: State, now: float) -> dict:
    """(cgroup, signal) -> its raised target, those whose time is up forgotten."""
    state.raised = {k: v for k, v in state.raised.items() if v[1] > now}      # (target, until)
    return {k: t for k, (t, _) in state.raised.items()}


def _allowance_held(settings, be, capacity: int) -> float:
    """What BE has before rule slack moved it: the sum of its quotas, or the whole node where one has none.
    Under policy cpuset cpu.max is not sampled (needs()): BE starts from the whole node."""
    limits = [parse_cpu_max(c.cpu_max) for c in be if c.cpu_max] if settings.policy == "cfs_quota" else []
    quotas = [q / p for q, p in limits if q is not None]
    return sum(quotas) if len(quotas) == len(be) else float(capacity)


def _readings(signals: list, raised: dict) -> tuple[dict, list]:
    """What the experiments observe: each signal's value, and the keys back in health (10% slack or more
    against the target, raised where it is)."""
    targets = {(cg, name): max(t, raised.get((cg, name), 0.0)) for cg, name, _, t in signals}
    values = {(cg, name): v for cg, name, v, _ in signals}
    return values, [k for k, v in values.items() if 1 - v / targets[k] >= GROW_AT]


def _lags(state: State, values: dict) -> dict:
    """How many seconds back each signal's value reaches: an SLO's quantile and the run queue's p99 are
    taken over enough recent rounds (HistogramWindow.span()), and cpu.pressure's avg10 is the kernel's
    average with a 10 s time constant (PSI_AVG10_LAG); an experiment on them waits that long for a cut to
    show (core/experiment.py)."""
    def window(name: str):
        return state.slo if name in SLO_QUANTILES else state.runq if name == "runq_p99_us" else None
    lags = {(cg, name): w.span(cg) for cg, name in values if (w := window(name)) is not None}
    return lags | {key: PSI_AVG10_LAG for key in values if key[1] == "cpu_pressure_avg10"}


def _note_slo_rounds(snapshot: Snapshot, state: State, signals: list, steer: tuple | None) -> list[str]:
    """Note whether this round's steering slack is below zero, and when each SLO last had a value. A class
    whose SLO has no value this round (a scrape every second, a round every half) is neither late nor
    healthy: its memory of the last round below zero survives it. Returns those measured within SLO_GAP: a
    round between two values, where the SLO's last word stands and BE does not grow. An SLO silent for
    longer (a stall it cannot see yet, a source that fails or never ran) leaves the class to its health
    targets alone, as guards: they may hold and cut BE for a bounded time, and BE grows on their health."""
    now = snapshot.time
    unmeasured = _unmeasured_slos(snapshot, signals)
    if steer is not None or not unmeasured:
        state.below_zero = steer is not None and steer[0] < 0
    state.slo_seen = {sig[0]: now for sig in signals if sig[1] in SLO_SIGNALS} | \
        {p: t for p, t in state.slo_seen.items() if p in unmeasured}
    return [p for p in unmeasured if now - state.slo_seen.get(p, -math.inf) <= SLO_GAP]


def _guard_clock(settings, state: State, steer: tuple | None, guard: tuple | None, now: float) -> bool:
    """Time how long a guard has held (or cut) BE while the SLO is met: after guard_cut_max the SLO decides
    and the guard rests (_guard_rest). Returns whether a guard may act this round."""
    s = steer[0] if steer is not None else None
    g = guard[0] if guard is not None else None
    if s is not None and s < HOLD_AT:
        state.guard_rest_times = 1    # the SLO itself at risk: what a guard sees matters again, its rest starts over
    if g is None or g >= HOLD_AT or (s is not None and s < HOLD_AT) or now < state.guard_off_until:
        state.guard_since = None
    elif state.guard_since is None:
        state.guard_since = now
    elif now - state.guard_since >= float(settings.guard_cut_max) and state.guard_cut is None:
        _guard_rest(settings, state, now)
    return g is not None and now >= state.guard_off_until


def _guard_rest(settings, state: State, now: float, signal: str | None = None) -> float:
    """A guard's episode (its hold, or its bounded cut, for guard_cut_max) ended with the SLO met throughout
    (the SLO at risk ends it otherwise): the guard rests guard_cut_max, doubling for each such episode in a row
    up to GUARD_REST_TIMES times (_guard_clock starts it over when the SLO comes at risk), and so does the
    whole-BE cut for `signal`. At a fixed rest, a run-queue proxy that stayed over its target while the SLO was
    met cut BE by 30% for 30 s of every minute for as long as it lasted (15% of BE's work, the SLO met
    throughout): the stall a guard is for is one the SLO cannot see yet, and the SLO saw none. Returns the rest."""
    rest = float(settings.guard_cut_max) * state.guard_rest_times
    state.guard_rest_times = min(2 * state.guard_rest_times, GUARD_REST_TIMES)
    state.guard_since, state.guard_off_until = None, now + rest
    if signal is not None:
        state.lab.rest_for(BE_CAP, signal, now + rest)
    return rest


def _verdict_step(settings, state: State, verdict: Verdict, running, experiment: dict,
                  healthy: Iterable, units: dict[str, float]) -> tuple[str | None, list]:
    """The running cut's verdict came due (its experiment ended): one that bought nothing is undone and its
    lever rests (a guard's bounded cut also ends the guard's episode: _guard_rest from its bound); one that helped while
    its signal is still not healthy is released once to test it (_release); a release is judged the other
    way round (_release_verdict). Returns the round's step (None where the cut helped and stays: the round
    goes on) and the actions. `units`: the BE pods a hot cap may take this round (_hot_units)."""
    if running.release is not None:
        return _release_verdict(state, verdict, running, experiment, units)
    if running.lever == LEAVE:
        # nothing to undo; where LS did not recover, the control arm rests and a cut may come next round
        return (None if verdict.helped else f"{verdict.text()}; {_rests(state.lab, verdict)}"), []
    stolen = _steal_rate(state, running.changed, state.lab.now) if running.lever == WAKE else None
    if running.lever == WAKE and not verdict.helped and not verdict.cost() and (stolen or 0.0) < WAKE_KEEP_STEAL_MS:
        # It takes no CPU from BE, and one window's verdict cannot see what it buys: held for good as a static
        # setting (be-idle-wake, 30 pairs on 2 CPUs) it gave LS a p99 of 0.94 (0.88-1.00) of cpu.idle alone's,
        # while koordd's own verdicts on it read "bought nothing" 48 times and "helped" 18. Kept so, koordd did
        # 1.20 (1.08-1.33) of the BE work it did releasing it (docs/benchmarks.md, 16 pairs). Released where it
        # cost latency, or once LS is healthy (_wake_upkeep); the cuts come next round, on top of it.
        return f"keep wake: {verdict.text()}; it takes no CPU from BE, held while LS is at risk", []
    if verdict.helped:
        if (running.lever in (BE_CAP, HOT_CAP) and running.bound is None and verdict.key not in set(healthy)
                and state.lab.retest(running.lever, running.conditions, state.lab.now)):
            return _release(state, verdict, running)
        return None, []
    lab, now = state.lab, state.lab.now
    if running.bound is not None:
        # A guard's cut that bought nothing ends its episode as one that ran its time would (at its bound): the
        # guard rests from there, so that it cuts at most once per 2 x guard_cut_max whenever the undo comes.
        # Resting from the undo, a cut undone after one 5 s window came back 20-28 s after the last (CI's VM).
        state.guard_cut = None
        _guard_rest(settings, state, running.bound, verdict.key[1])
    step = f"undo: {verdict.text()}; {_rests(lab, verdict)}"
    if stolen is not None and stolen >= WAKE_KEEP_STEAL_MS and not verdict.cost():
        step += (f"; not kept unproven: the hypervisor took {stolen:.0f} ms a second from a vCPU while it was "
                 f"held (a polling vCPU gives the host nothing back)")
    _forget_miss(state, running)
    return step, _undo_actions(state, running, step, experiment)


def _rests(lab, verdict: Verdict) -> str:
    """How long the verdict's lever now rests for its signal, as the decision says it."""
    rest = lab.resting(verdict.lever, verdict.key[1], lab.now)
    return f"{verdict.lever} rests {round(rest, 1):g}s for {verdict.key[1]}"


def _steal_rate(state: State, since: float, now: float) -> float | None:
    """Ms a second the hypervisor took from the worst vCPU over the rounds after `since` up to `now` (None: no
    round counted). Where the host takes time back, the wake request's polling vCPUs make it take more: against
    the memory antagonist on 2 CPUs, held for good beside cpu.idle, the steal was 1.57 (1.36-1.81) of cpu.idle
    alone's in 14 of 14 pairs and LS's server-side p99 1.32 (1.11-1.58), a cost one window's verdict cannot
    see (docs/benchmarks.md); there it is kept only where it helped. Against membw the host took about 1 ms a
    second and kept, the request bought BE 1.20 of its work at the same p99."""
    stolen = [ms for t, ms in state.steal.points.get(STEAL, ()) if since < t <= now]
    return sum(stolen) / (now - since) if stolen and now > since else None


def _release(state: State, verdict: Verdict, e) -> tuple[str, list]:
    """A/B/A (core/experiment.py): cut `e` was judged helped, yet its signal is still not healthy, and one
    comparison of a wandering signal can call a useless cut "helped" (4 floors of 13 in CI's VM, each then
    holding BE down). Release it for one window, judged as a cut is: what puts it back is kept with it."""
    lab = state.lab
    if e.lever == BE_CAP:
        back = (state.allowance, state.at_floor)
    else:
        back = {cg: state.hot[cg] for cg in e.undo if cg in state.hot}
    step = f"release to test: {verdict.text()}, yet {verdict.key[1]} is not healthy"
    actions = _undo_actions(state, e, step, verdict.fields())
    lab.start(lab.now, e.lever, e.key, e.be_before - verdict.be_given_up, e.conditions, undo=back, release=verdict)
    return step, actions


def _release_verdict(state: State, verdict: Verdict, e, experiment: dict, units: dict[str, float]) -> tuple[str, list]:
    """A released cut's verdict: where releasing it cost latency the cut helps, and goes back (_recut);
    where it cost nothing the cut bought nothing after all: it stays released and its lever rests."""
    if verdict.helped:
        step = f"cut again: {verdict.text()}"
        return step, _recut(state, e, step, experiment, units)
    _forget_miss(state, e)
    return f"stay released: {verdict.text()}; {_rests(state.lab, verdict)}", []


def _recut(state: State, e, step: str, experiment: dict, units: dict[str, float]) -> list[Action]:
    """Put back the cut that release `e` took away: BE's allowance (and its floor, whose hold starts
    again: what LS shows at the floor decides any raised target), or the hot caps on the pods that a hot
    cap may still take (`units`: one that left BE, became protected or went idle during the release is
    left alone)."""
    if e.lever == BE_CAP:
        allowance, floor = e.undo
        state.allowance = min(state.allowance, allowance)
        if floor:
            state.at_floor, state.floor_since = True, state.lab.now
        return []
    caps = {cg: v for cg, v in e.undo.items() if cg not in state.hot and cg in units}
    state.hot.update(caps)
    return [Action(cg, "cpu.max", value, {"rule": "slack", "lever": HOT_CAP, "step": step, "experiment": experiment},
                   f"hot cap on {cg} again: {step}") for cg, value in sorted(caps.items())]


def _what(e) -> str:
    if e.lever == LEAVE:
        return "BE left alone"
    return f"the release of the {e.lever} cut" if e.release is not None else f"the {e.lever} cut"


def _lapsed_step(state: State, e) -> tuple[str, list]:
    """The running cut's signal gave no value from the cut to its due time (its LS work gone or idle): there
    is nothing to judge it by, so what it moved goes back, and the lever does not rest. Without this a
    floor taken as LS's last waits ended held BE there for good ("hold: judging the cut"). A release stays
    released: it gave BE back its CPU, and nothing says the cut is needed."""
    if e.release is not None:
        return f"stay released: {e.key[1]} of {e.key[0]} gave no value since the release of the {e.lever} cut", []
    if e.bound is not None:
        state.guard_cut = None
    if e.lever == LEAVE:
        return f"{e.key[1]} of {e.key[0]} gave no value since BE was left alone: nothing to judge it by", []
    step = (f"undo: {e.key[1]} of {e.key[0]} gave no value since the {e.lever} cut (its work gone or idle): "
            f"nothing to judge the cut by")
    _forget_miss(state, e)
    return step, _undo_actions(state, e, step, e.fields())


def _undo_actions(state: State, e, step: str, experiment: dict) -> list[Action]:
    """What puts back experiment `e`'s moves (_undo), each saying the round's step and the experiment."""
    return [Action(a.target, a.knob, a.value, {**a.reason, "step": step, "experiment": experiment},
                   f"{a.message}: {step}") for a in _undo(state, e)]


def _guard_cut_over(settings, state: State, now: float) -> str | None:
    """A guard's bounded cut that ran guard_cut_max ends: the step that says so, else None."""
    if state.guard_cut is None or now < state.guard_cut[0]:
        return None
    rest = _end_guard_cut(settings, state, now)
    return (f"guard cut ends after {float(settings.guard_cut_max):g}s: the SLO decides, and it is met; "
            f"the guard rests {rest:g}s")


def _end_guard_cut(settings, state: State, now: float, give_back: bool = True) -> float:
    """End the guard's cut and its experiment (if still running) without a verdict. Where it ran its time
    (`give_back`) BE gets back what it had before it and the guard rests (_guard_rest); where the SLO itself
    came at risk BE keeps the cut and the guard's lever rests guard_cut_max for its signal. Returns the rest."""
    lab = state.lab
    _, base, signal = state.guard_cut
    if lab.running is not None and lab.running.bound is not None:
        lab.abandon()
    state.guard_cut = None
    if give_back:
        state.allowance = max(state.allowance, base)
        return _guard_rest(settings, state, now, signal)
    lab.rest_for(BE_CAP, signal, now + float(settings.guard_cut_max))
    return float(settings.guard_cut_max)


def _unmeasured_slos(snapshot: Snapshot, signals: list) -> list[str]:
    """The LS class roots with an SLO that has no value this round (their source measured nothing)."""
    measured = {sig[0] for sig in signals if sig[1] in SLO_SIGNALS}
    return sorted(c.path for c in snapshot.of_class(*LATENCY_SENSITIVE)
                  if snapshot.slo_of(c.path) is not None and c.path not in measured)


def _steer_cut(snapshot, settings, state: State, rd: SlackRound) -> tuple[str, list[Action]]:
    """The steering signal is under 5% slack: raise the targets where the floor bought nothing for
    slack_floor_hold, deepen the running cut to the floor (a second round below zero) or wait for its
    verdict, hold at the floor, confirm, or start a cut with the lever that bought most here."""
    lab, now, worst = state.lab, rd.now, rd.steer[1]
    running = lab.running
    if state.at_floor and now - state.floor_since >= float(settings.slack_floor_hold) and running is None:
        return _raise_targets(snapshot, state, rd), []
    if running is not None:
        if (running.lever == BE_CAP and running.release is None and not state.at_floor and lab.settled(now)
                and _deep_miss(state, rd)):
            # Only on what the signal shows after the cut: a windowed p99 holds the answers from before it
            # for its lag, and deepened on those every cut went to the floor (16 CPUs, membw: 2 s after a shrink).
            _to_floor(state, rd)
            state.healthy_at = None           # LS was not healthy there after all (or is no longer)
            lab.deepen(now)
            return "floor", []
        # A release under test is not cut deeper: its verdict, one window on, puts the cut back if it hurt.
        return ("floor" if state.at_floor else f"hold: judging {_what(running)}"), []
    if state.at_floor:
        return "floor", []
    if not lab.confirmed((worst["cgroup"], worst["signal"]), now, worst["target"] * (1 - HOLD_AT)):
        # One round over is no reason to cut: the rounds before a cut must show the state that prompts it
        # (core/experiment.py judges the cut against their median).
        return f"hold: {worst['signal']} near or over its target, confirming before a cut", []
    return _start_cut(snapshot, settings, state, rd)


def _raise_targets(snapshot: Snapshot, state: State, rd: SlackRound) -> str:
    """BE has been at its floor and LS still misses its targets: BE is not what LS is short of. Judge BE
    from now on against what LS shows without it (+25%), for RAISED_FOR seconds."""
    steer, _ = _split(snapshot, rd.signals)
    for cgroup, name, value, target in steer:
        if value * RAISE_MARGIN > target:
            state.raised[(cgroup, name)] = (value * RAISE_MARGIN, rd.now + RAISED_FOR)
    state.at_floor = state.below_zero = False
    _forget_levels(state)                            # BE's use was not what LS missed for
    return "LS misses its targets without BE too: targets raised to what it shows at the floor"


def _deep_miss(state: State, rd: SlackRound) -> bool:
    """Whether the steering signal's miss calls for the floor: below zero slack in this round and the last, and
    over its target by more than FLOOR_MISS of it and by more than the signal's own noise (its spread over the
    quiet rounds of the last minute, core/experiment.py). A shallower miss gets a shrink. On the 2-CPU host
    (bench-qos --frontier, 2026-11-29) floors came at misses of 0.7-12% of a windowed p99 whose noise was
    1.3-10.9 ms: each took 98% of BE's CPU for the 5 s or more its verdict needed, and three of five were
    judged to have bought nothing (redis against the memory antagonist: 15.47 -> 8.04 ms against a margin of 26.16 ms),
    which cost koordd half of the oracle's BE work at 1.25 x LS alone."""
    if rd.s is None or rd.s >= 0 or not rd.below:
        return False
    worst = rd.steer[1]
    noise, _ = state.lab.history.spread((worst["cgroup"], worst["signal"]))
    return worst["value"] - worst["target"] > max(FLOOR_MISS * worst["target"], noise)


def _to_floor(state: State, rd: SlackRound) -> None:
    state.floor_since, state.allowance, state.at_floor = rd.now, rd.floor, True


def _start_cut(snapshot, settings, state: State, rd: SlackRound) -> tuple[str, list[Action]]:
    """A confirmed risk and no cut running: the wake lever where it is free (it costs BE nothing), else the
    cut that bought most under these conditions (a hot cap, the whole-BE cap), else leave BE alone where
    every cut rests. The cut is an experiment from here."""
    lab, now, worst = state.lab, rd.now, rd.steer[1]
    key = (worst["cgroup"], worst["signal"])
    cond = rd.conditions(worst["signal"])
    if _wake_free(snapshot, settings, state, worst["signal"]):
        return _wake_lever(state, key, rd.be_used, cond, worst)
    levers = lab.order([HOT_CAP, BE_CAP] if len(rd.units) >= 2 else [BE_CAP], cond, now)
    if not levers:
        # Leaving BE alone is a lever too: where every cut bought nothing, what earlier steps took from BE
        # has no reason left either, and grows back as in a healthy round (cpu.idle decides who runs).
        lab.chose(LEAVE)
        _forget_levels(state)
        step = f"leave BE alone (cpu.idle decides who runs): every cut rests for {worst['signal']} after buying nothing"
        if state.allowance < rd.capacity:
            _grow_allowance(settings, state, rd.capacity)
            step += "; BE grows back"
        return step, []
    if (hopeless := _cannot_show(state, key, now)) is not None:
        return hopeless, []
    if (alone := _control(settings, state, levers[0], cond)) is not None:
        lab.start(now, LEAVE, key, rd.be_used, cond)
        return alone, []
    if levers[0] == HOT_CAP:
        capped = _hot_cap(state, settings, rd.units, key)
        lab.start(now, HOT_CAP, key, rd.be_used, cond, undo=capped)
        return f"hot cap on {', '.join(capped)}", [
            Action(cg, "cpu.max", state.hot[cg], {"rule": "slack", "lever": HOT_CAP, "step": "hot cap",
                                                   "cpus": round(rd.units[cg], 3), "worst": worst,
                                                   "experiment": lab.running.fields()},
                   f"hot cap on {cg} (using {rd.units[cg]:.2f} CPUs) for {worst['cgroup']} {worst['signal']}")
            for cg in capped]
    lab.start(now, BE_CAP, key, rd.be_used, cond, undo=state.allowance)
    healthy = state.healthy_at
    blame = _note_miss(settings, state, rd)
    said = "" if blame.blamed else f"; no new growth ceiling: {blame.text()}"
    if healthy is not None and rd.floor < healthy < rd.be_used:
        # Where LS was healthy a while ago with less BE, the cut goes back there first; if LS still misses
        # deeply once the signal can show it, the floor follows (_steer_cut).
        state.allowance = healthy
        return f"shrink (back to {healthy:.2f} CPUs, where LS was last healthy){said}", []
    if _deep_miss(state, rd):
        _to_floor(state, rd)
        return f"floor{said}", []
    # A shallow miss, or one round below zero (one wild sample, a p99 of a few waits): give back part of what
    # BE uses (a share of an allowance BE does not use takes nothing), and go to the floor if the next round
    # misses deeply. The allowance comes back as it was where this cut bought nothing.
    state.allowance = max(min(state.allowance, rd.be_used), rd.floor) * (1 - settings.slack_shrink_percent / 100)
    return ("shrink (below zero)" if rd.s < 0 else "shrink") + said, []


def _control(settings, state: State, best: str, cond: tuple) -> str | None:
    """Whether this confirmed risk is left alone (the control arm, core/experiment.py's LEAVE), and the step
    that says why; else None (the cut `best` goes ahead). A cut is judged against the rounds before it, and a
    risk that passes on its own (a spike, a burst of requests) reads as a cut that helped: on 2 CPUs over
    minutes LS missed with BE at 0.02-0.95 CPUs, each cut "helped" as the spike passed, and BE did 50% of its
    work where cpu.idle alone gave it 65.5% at the same p99. Left alone now and then, and judged the same way,
    a risk shows how often LS recovers without the cut; the cut is taken where it helps more often than that.
    The first trials come only once the cut has helped CONTROL_AFTER times here, one risk in CONTROL_EVERY:
    never on a fresh koordd's first misses. Where BE is then left alone, each such risk is judged and LS left
    alone's record grows, so a leave chosen on lucky trials corrects itself; a cut chosen on unlucky ones
    would not (only the cut's record grows), so trials go on while the verdicts leave it unclear."""
    lab, most = state.lab, settings.control_trials
    state.risks_since_control += 1
    if most == 0 or lab.resting(LEAVE, cond[2], lab.now):
        return None
    cut, alone = lab.record(best, cond), lab.record(LEAVE, cond)
    trials = alone.helped + alone.nothing
    if trials >= most:
        if alone.score >= cut.score:
            state.risks_since_control = 0
            return (f"leave BE alone: LS recovered left alone {_tally(alone)}, the {best} cut helped {_tally(cut)}")
        # The cut looks better; while a few verdicts leave that unclear, trials go on at half the rate. A cut
        # chosen on three unlucky trials would otherwise never meet the control arm again: the cut's own
        # record grows, LS left alone's stays as those three trials left it.
        edge = chance_better(cut, alone)
        if (edge >= CONTROL_CLEAR or trials >= CONTROL_MORE * most
                or state.risks_since_control < 2 * CONTROL_EVERY):
            return None
        state.risks_since_control = 0
        return (f"leave BE alone to test again (trial {trials + 1}, at most {CONTROL_MORE * most}): the {best} "
                f"cut helped {_tally(cut)}, LS recovered left alone {_tally(alone)}: the chance that the cut is the "
                f"better is {edge:.0%}, under {CONTROL_CLEAR:.0%}")
    if cut.helped - cut.retracted < CONTROL_AFTER or state.risks_since_control < CONTROL_EVERY:
        return None
    state.risks_since_control = 0
    return (f"leave BE alone to test (trial {trials + 1} of {most}): the {best} cut helped "
            f"{_tally(cut)}; does LS recover as often without it?")


def _tally(r: Record) -> str:
    return f"{r.helped - r.retracted} of {r.helped + r.nothing} times"


def _guard_cut(settings, state: State, rd: SlackRound) -> str:
    """The SLO is met (or not measured this round) while a class's run-queue latency or pressure is over
    its target: hold, with at most one cut of slack_shrink_percent, undone within guard_cut_max; never
    the floor."""
    lab, now, worst = state.lab, state.lab.now, rd.guard[1]
    if state.guard_cut is not None:
        return f"guard: hold the bounded cut (ends in {state.guard_cut[0] - now:g}s at most)"
    if lab.resting(BE_CAP, worst["signal"], now):
        return f"guard: hold ({worst['signal']} over target, the SLO met; its cut rests)"
    if not lab.confirmed((worst["cgroup"], worst["signal"]), now, worst["target"]):
        return f"guard: hold ({worst['signal']} over target, the SLO met; confirming before a cut)"
    if (hopeless := _cannot_show(state, (worst["cgroup"], worst["signal"]), now)) is not None:
        return "guard: " + hopeless
    cond = rd.conditions(worst["signal"])
    until = now + float(settings.guard_cut_max)
    lab.start(now, BE_CAP, (worst["cgroup"], worst["signal"]), rd.be_used, cond, undo=state.allowance, bound=until)
    state.guard_cut = (until, state.allowance, worst["signal"])
    state.allowance *= 1 - settings.slack_shrink_percent / 100
    return f"guard: one cut for at most {float(settings.guard_cut_max):g}s ({worst['signal']} over target, the SLO met)"


def _cannot_show(state: State, key, now: float) -> str | None:
    """The hold where a cut on `key` could never be judged to have helped (Lab.can_show: the signal's noise
    asks more of it than the signal's whole level), else None. Such a cut would cost BE its window and be
    undone whatever it did; BE holds instead, and the cut comes once the noise has left the signal's last
    minute. Such rounds write nothing, so they are counted for status.json (report: unshowable_rounds)."""
    possible, before, need = state.lab.can_show(key, now)
    if possible:
        return None
    state.unshowable_rounds += 1
    signal = key[1]
    return (f"hold: no cut could show here ({signal} at {show_value(signal, before)}, its noise asks a gain of "
            f"{show_value(signal, need)})")


def _note_round(settings, state: State, rd: SlackRound) -> None:
    """Count the round in the miss ledger of LS's load band (core/miss_rate.py): BE's use, and whether the
    steering signal is at risk (under 5% slack). Bins of an eighth of a growth step; a new ledger where the
    node's size moved. One per band: at another load LS tolerates another level of BE."""
    if rd.s is None:
        return
    width, band = _creep(settings, rd.capacity), _load_band(rd)
    ledger = state.misses.get(band)
    if ledger is None or ledger.width != width:
        ledger = state.misses[band] = MissLedger(width)
    ledger.note(rd.now, rd.be_used, rd.s < HOLD_AT)


def _creep(settings, capacity: int) -> float:
    return settings.slack_grow_percent / 100 * capacity / CREEP_STEPS


def _note_miss(settings, state: State, rd: SlackRound) -> Blame:
    """A whole-BE cut starts: LS missed with BE using rd.be_used. Where LS began to miss about as often with
    less BE (the ledger's blame), BE's use says nothing of what LS tolerates: the growth ceiling stays as it
    was. Else it is set there; where that is near the last miss (within two eighths of a step: a probe past
    it, or the last halving below it, missed), the wait before the next probe doubles; else it starts over at
    DWELL_FIRST. Returns the blame."""
    ledger = state.misses.get(_load_band(rd))
    blame = ledger.blame(rd.be_used) if ledger is not None else Blame(True, rd.be_used, (0, 0), (0, 0), None)
    if not blame.blamed:
        return blame
    creep = _creep(settings, rd.capacity)
    again = state.missed_at is not None and abs(rd.be_used - state.missed_at) <= 2 * creep
    state.dwell = min(2 * state.dwell, DWELL_MAX) if again and state.dwell else DWELL_FIRST
    state.missed_at = max(rd.be_used, rd.floor)
    state.probe_at = rd.now + state.dwell
    state.missed_band = _load_band(rd)
    return blame


def _load_band(rd: SlackRound) -> int:
    return conditions(rd.others, rd.capacity, (), "")[0]


def _forget_stale_miss(state: State, rd: SlackRound) -> None:
    """Where LS's load moved to another fifth of the node since the miss, BE's use then says nothing of now:
    growth goes back to whole steps (and a miss finds the level again)."""
    if state.missed_at is not None and state.missed_band != _load_band(rd):
        _forget_levels(state)


def _forget_levels(state: State) -> None:
    """Growth remembers nothing: BE's use and allowance then say nothing of what LS tolerates now. (The wait
    before a probe needs no reset: _note_miss starts it over where no miss is remembered.)"""
    state.missed_at = state.healthy_at = None


def _forget_miss(state: State, e) -> None:
    """A whole-BE cut found useless (or with nothing to judge it by): BE's use was not what LS missed for,
    so growth need not stop short of it."""
    if e.lever == BE_CAP:
        state.missed_at = None


def _undo(state: State, e) -> list[Action]:
    """Put back what experiment `e` moved (a release moved nothing back to put: it gave BE its CPU)."""
    if e is None or e.release is not None or e.lever == LEAVE:
        return []
    if e.lever == WAKE:
        return _wake_release(state, "its cut is undone")
    if e.lever == BE_CAP:
        state.allowance = max(state.allowance or 0.0, e.undo)
        state.at_floor = state.below_zero = False
        return []
    return _lift_hot(state, "its cut is undone", only=e.undo)


def _wake_can_act(snapshot: Snapshot) -> bool:
    """Whether a CPU latency request can change anything on this host: it has the knob and a cpuidle driver.
    With none ("none") CPUs idle by the architecture's halt, which no request governs; tried there, the lever
    cost an experiment window (a miss met with nothing) every time LS was at risk, and where the signal
    happened to fall in that window it was kept as "helped" (16.0 -> 4.1 ms in 3 s on the 2-CPU host)."""
    return WAKE_KNOB in snapshot.supported and snapshot.node.cpuidle_driver != "none"


def _wake_free(snapshot: Snapshot, settings, state: State, signal: str) -> bool:
    """Whether the wake lever may be tried now: on, able to act here, not held, not resting for `signal`."""
    return (_wake_on(settings) and _wake_can_act(snapshot) and not state.wake
            and not state.lab.resting(WAKE, signal, snapshot.time))


def _wake_lever(state: State, key, be_used: float, cond: tuple, worst: dict) -> tuple[str, list[Action]]:
    """Hold 0 µs CPU wake-up latency, judged as a cut is: it costs BE nothing, so it goes before any cut."""
    lab, now = state.lab, state.lab.now
    lab.start(now, WAKE, key, be_used, cond)
    state.wake, state.wake_calm = True, None
    return "wake: CPUs kept out of deep idle (cpu_dma_latency 0), BE keeps its CPU", [
        Action(NODE, WAKE_KNOB, "0", {"rule": "slack", "lever": WAKE, "step": "wake", "worst": worst,
                                      "experiment": lab.running.fields()},
               f"CPUs kept out of deep idle (cpu_dma_latency 0 µs) for {worst['cgroup']} {worst['signal']}")]


def _wake_release(state: State, why: str) -> list[Action]:
    state.wake, state.wake_calm = False, None
    return [restore(NODE, WAKE_KNOB, f"CPU wake-up latency request released: {why}", rule="slack", lever=WAKE,
                    step="release")]


def _wake_upkeep(snapshot: Snapshot, settings, state: State, slack: float | None) -> list[Action]:
    """Let the wake lever's request go where it no longer serves: turned off or the knob gone, held from
    before a restart or reload (its state is lost), or LS healthy (slack >= 10%) for WAKE_CALM_WINDOWS
    experiment windows in a row while no experiment runs (its release would muddle the verdict)."""
    now = snapshot.time
    if not state.wake:
        if (NODE, WAKE_KNOB) in snapshot.held:
            return [restore(NODE, WAKE_KNOB, "CPU wake-up latency request from before a restart or reload "
                                             "released", rule="slack", lever=WAKE, step="release")]
        return []
    if not _wake_on(settings) or not _wake_can_act(snapshot):
        return _wake_release(state, "the wake lever is off, or it cannot act on this host")
    if slack is None or slack < GROW_AT or state.lab.running is not None:    # no release mid-experiment
        state.wake_calm = None
        return []
    if state.wake_calm is None:
        state.wake_calm = now
    calm = WAKE_CALM_WINDOWS * float(settings.experiment_window)
    if now - state.wake_calm >= calm:
        return _wake_release(state, f"LS healthy (slack {slack:.0%}) for {calm:g}s")
    return []


def _lift_hot(state: State, why: str, only=None) -> list[Action]:
    out = []
    for cg in sorted(state.hot):
        if only is None or cg in only:
            del state.hot[cg]
            out.append(restore(cg, "cpu.max", f"hot cap on {cg} lifted: {why}", rule="slack", lever=HOT_CAP,
                               step="uncap"))
    return out


def _hot_units(snapshot: Snapshot, settings, state: State) -> tuple[dict[str, float], list[Action]]:
    """The BE pods or jobs a hot cap may take (busy, not protected, not capped as an antagonist) with their
    CPU use, fed into their CPU history; and the lifting of hot caps on those gone or unknown (a restart)."""
    if not _hot_cap_on(settings):
        return {}, _lift_hot(state, "hot caps are off") if state.hot else []
    guard = Protected.of_snapshot(snapshot)
    members = {u.path: u.cpu_usage for u in snapshot.units("BE") if u.path not in snapshot.cgroups}
    units = {p: c for p, c in members.items() if c is not None and not guard.why(p) and p not in state.capped}
    state.be_cpu.forget_except(members)
    for p, c in units.items():
        state.be_cpu.add(snapshot.time, p, c)
    out = _lift_hot(state, "the cgroup left BE or is protected",
                    only={p for p in state.hot if p not in members or guard.why(p)})
    if not _antagonists_on(settings):      # else the antagonist part lifts what nobody knows
        out += [restore(cg, "cpu.max", f"hot cap on {cg} from before a restart ends", step="uncap")
                for cg, knob in sorted(snapshot.held) if knob == "cpu.max" and cg in members and cg not in state.hot]
    return {p: c for p, c in units.items() if c >= BUSY_CORES}, out


def _hot_cap(state: State, settings, units: dict[str, float], key) -> list[str]:
    """Cap the BE cgroups whose CPU use follows the signal best (Pearson over the history; the busiest where
    none does), half of them at most, to hot_cap_percent less than they use. Returns them."""
    signal = state.lab.history.series(key)
    def rank(p: str) -> tuple[float, float]:
        pairs = [(signal[t], c) for t, c in state.be_cpu.points.get(p, ()) if t in signal]
        r = pearson([a for a, _ in pairs], [b for _, b in pairs])
        return (r if r is not None and r > MIN_CORRELATION else 0.0, units[p])
    chosen = sorted(units, key=rank, reverse=True)[:max(1, len(units) // 2)]
    for p in chosen:
        cores = units[p] * (1 - settings.hot_cap_percent / 100)
        state.hot[p] = format_cpu_max(max(CFS_QUOTA_MIN, round(cores * DEFAULT_PERIOD_US)), DEFAULT_PERIOD_US)
    return sorted(chosen)


def _antagonist_actions(snapshot: Snapshot, settings, state: State) -> list[Action]:
    """Cap the BE cgroup whose CPU use follows an LS victim's signal; lift caps whose time is up."""
    if state.detector is None:
        state.detector = Detector(float(settings.antagonist_window), outliers_needed=settings.antagonist_outliers,
                                  min_cpu=settings.antagonist_min_cpus)
    detector, now = state.detector, snapshot.time
    section = snapshot.section(SIGNAL_SECTIONS[settings.antagonist_signal]) or {}
    ls = {c.path: (_signal(section.get(c.path), settings.antagonist_signal), c.cpu_usage)
          for c in snapshot.of_class(*LATENCY_SENSITIVE)}
    guard = Protected.of_snapshot(snapshot)
    suspects = {u.path: u.cpu_usage for u in snapshot.units("BE")
                if u.path not in snapshot.cgroups and not guard.why(u.path)}
    victims = detector.observe(now, ls, suspects)

    actions = _antagonist_lifts(snapshot, state, suspects, now)
    cap = format_cpu_max(max(CFS_QUOTA_MIN, round(settings.antagonist_cap_cpus * DEFAULT_PERIOD_US)),
                         DEFAULT_PERIOD_US)
    for v in victims:
        found = detector.suspect(v.cgroup, [p for p in suspects if p not in state.capped])
        if found is not None and found[1] >= MIN_CORRELATION:
            actions.append(_antagonist_cap(settings, state, v, found, suspects, cap, now))
    for cg in sorted(set(state.capped) - {a.target for a in actions}):
        actions.append(Action(cg, "cpu.max", cap, {"step": "hold"}, f"antagonist cap on {cg} holds"))
    return actions


def _antagonist_lifts(snapshot: Snapshot, state: State, suspects: dict, now: float) -> list[Action]:
    """Lift the antagonist caps whose time is up or whose cgroup is no suspect now, and those in the journal
    this state does not know (a restart or reload lost their timers)."""
    actions = []
    for cg in sorted(state.capped):
        if now >= state.capped[cg] or cg not in suspects:
            del state.capped[cg]
            actions.append(restore(cg, "cpu.max", f"antagonist cap on {cg} ends", step="uncap"))
    for cg, knob in sorted(snapshot.held):
        if knob == "cpu.max" and cg in suspects and cg not in state.capped and cg not in state.hot:
            actions.append(restore(cg, "cpu.max", f"antagonist cap on {cg} from before a restart ends",
                                   step="uncap"))
    return actions


def _antagonist_cap(settings, state: State, v, found: tuple[str, float], suspects: dict, cap: str,
                    now: float) -> Action:
    """Cap the suspect whose CPU use follows victim `v`'s signal (r = found[1]) for antagonist_cap_duration;
    the victim's episode is answered: the next needs new outliers. The reason holds the evidence."""
    suspect, r = found
    state.capped[suspect] = now + float(settings.antagonist_cap_duration)
    state.detector.outlier_times[v.cgroup].clear()
    return Action(suspect, "cpu.max", cap, {
        "victim": v.cgroup, "signal": settings.antagonist_signal, "value": round(v.value, 3),
        "baseline_mean": round(v.mean, 3), "baseline_sigma": round(v.sigma, 3), "outliers": v.outliers,
        "window_s": float(settings.antagonist_window), "correlation": round(r, 3),
        "suspect_cpus": suspects.get(suspect), "cap_cpus": settings.antagonist_cap_cpus,
        "cap_s": float(settings.antagonist_cap_duration)},
        f"{v.cgroup}'s {settings.antagonist_signal} {v.value:.3g} is above its baseline {v.mean:.3g} + 2σ "
        f"({v.outliers} times); {suspect}'s CPU use follows it (r={r:.2f}): capped to "
        f"{settings.antagonist_cap_cpus:g} CPUs for {float(settings.antagonist_cap_duration):g}s")


def _signal(sample, kind: str) -> float | None:
    """The victim-side number: run-queue p99 (the mean where only schedstat is there), or CPI."""
    if sample is None:
        return None
    if kind == "runq":
        return sample.p99_us if sample.p99_us is not None else sample.mean_us
    return sample.cpi


def _windowed_peak(window: deque, now: float, value: float, span: float) -> float:
    window.append((now, value))
    while window and window[0][0] < now - span:
        window.popleft()
    return max(v for _, v in window)


def _peak_pressure(samples: tuple[CgroupSample, ...]) -> float | None:
    values = [s.cpu_pressure.some.avg10 for s in samples if s.cpu_pressure and s.cpu_pressure.some]
    return max(values) if values else None


@dataclass(frozen=True)
class Sizing:
    """BE's share this round, as the knobs are written: `allowance` CPUs of the node's `capacity`, cut
    further when LS is under pressure (`guard`), grown by at most `grow` of the node per round; `reason`
    and `why` go with every action."""
    capacity: int
    allowance: float
    guard: bool
    reason: dict
    why: str
    grow: float = GROW_FRACTION
    say: bool = False            # on record even where nothing changes (a cut judged to have helped)


def _limit_actions(snapshot: Snapshot, settings, be, sizing: Sizing) -> list[Action]:
    """The BE cgroups' limit by the knob `policy` names (cpu.max or cpuset.cpus), the other one given back."""
    if settings.policy == "cfs_quota":
        return _quota_actions(be, sizing, settings.psi_guard_shrink_percent)
    return _cpuset_actions(snapshot, be, sizing, settings.psi_guard_shrink_percent)


def _quota_actions(be, s: Sizing, shrink_percent: float) -> list[Action]:
    actions = []
    for cg in be:
        # No cpu.max (controller not enabled for the cgroup): ask anyway, so the refusal is on record.
        quota, period = parse_cpu_max(cg.cpu_max) if cg.cpu_max else (None, DEFAULT_PERIOD_US)
        node_us = s.capacity * period
        current = node_us if quota is None else quota
        target = s.allowance / len(be) * period
        if s.guard:
            target = min(target, current * (1 - shrink_percent / 100))
        if target > current:
            target = min(target, current + s.grow * node_us)
        target = round(max(target, MIN_QUOTA_US))
        actions.append(restore(cg.path, "cpuset.cpus", "policy is cfs_quota"))
        if s.allowance >= s.capacity and not s.guard:
            # The whole node: no cap at all, so one BE cgroup may use what another leaves.
            if quota is not None or s.say:
                actions.append(Action(cg.path, "cpu.max", format_cpu_max(None, period),
                                      {**s.reason, "quota_us": None, "period_us": period, "be_cgroups": len(be)}, s.why,
                                      say=s.say))
            continue
        if quota is not None and abs(target - current) < SKIP_FRACTION * node_us:
            if not s.say:
                continue
            target = current        # nothing to move: the cut stays, on record
        actions.append(Action(cg.path, "cpu.max", format_cpu_max(target, period),
                              {**s.reason, "quota_us": target, "period_us": period, "be_cgroups": len(be)}, s.why,
                              say=s.say))
    return actions


def _cpuset_actions(snapshot: Snapshot, be, s: Sizing, shrink_percent: float) -> list[Action]:
    topology = snapshot.node.topology or tuple(CpuTopology(c, c, 0) for c in range(s.capacity))
    lse = set()
    for cg in snapshot.of_class("LSE"):
        lse |= parse_cpulist(cg.cpuset_cpus or "")
    usable = [t for t in topology if t.cpu not in lse]
    current = parse_cpulist(be[0].cpuset_cpus or "") or {t.cpu for t in usable}
    want = max(math.ceil(s.allowance - 1e-9), MIN_CPUSET_CPUS)
    if s.guard:
        want = min(want, len(current) - max(1, math.floor(len(current) * shrink_percent / 100)))
    want = min(max(want, MIN_CPUSET_CPUS), len(current) + math.ceil(s.grow * len(topology)), len(usable))
    cpus = format_cpulist(pick_cpus(usable, want))
    actions = []
    for cg in be:
        actions.append(restore(cg.path, "cpu.max", "policy is cpuset"))
        actions.append(Action(cg.path, "cpuset.cpus", cpus, {**s.reason, "cpus": want, "lse_cpus": len(lse)}, s.why,
                              say=s.say))
    return actions


def pick_cpus(usable: list[CpuTopology], n: int) -> set[int]:
    """n CPUs: whole SMT cores first, taken round-robin over NUMA nodes, highest cores and nodes first
    (CPU 0 and its neighbours usually carry the host's interrupts). Same input, same answer,
    and a larger n is a superset of a smaller one, so BE's set only grows or shrinks at the edge."""
    nodes: dict[int, dict[int, list[int]]] = {}
    for t in usable:
        nodes.setdefault(t.numa_node, {}).setdefault(t.core, []).append(t.cpu)
    queues = [sorted(cores.values(), key=lambda cpus: -min(cpus))
              for _, cores in sorted(nodes.items(), reverse=True)]
    order: list[int] = []
    while any(queues):
        for q in queues:
            if q:
                order.extend(sorted(q.pop(0)))
    return set(order[:n])
