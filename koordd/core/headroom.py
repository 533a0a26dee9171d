"""Standing headroom: keep BE from holding every vCPU busy where the hypervisor takes busy vCPUs away.

On a VM the host may run something else on a vCPU's physical CPU. The guest sees that only as steal
(/proc/stat), and LS's requests on that vCPU wait the whole time. Measured on the 2-CPU VM this project
develops on (docs/benchmarks.md, "Steal"): with a SCHED_IDLE spinner per vCPU (100% busy) the host took a
vCPU for about 100 ms at a time, several times a minute; with the spinners capped at 90% of the node or
less, never. memcached against the memory antagonist at 70% load: 13 of its 18 slow windows lost a vCPU
for 50 ms or more, none of 27 LS-alone windows did, and a static cap at 60% of the node gave BE twice
the work of leaving it alone (cpu.idle) at a third of the p99. A cut answering each miss cannot help: the
stall is over before the cut lands (koordd's were all judged "bought nothing" and undone). What can is a
vCPU that idles now and then, so the ceiling stands for minutes, not rounds. Another hour the same host
took vCPUs from LS alone too (41 of 56 windows, LS at 1.18 of 2 CPUs): there a trial finds the stalls
going on and rests.

The headroom is that ceiling on BE's allowance: the node less `percent` of it, less what LS and the system
use. It is an experiment of minutes, judged by counting, because the events are minutes apart:

- trigger: over the last WATCH seconds, at least TRIGGER rounds in which a vCPU lost STOLEN_MS or more
  while BE used more than the ceiling would have let it ("binding": the headroom would have changed
  something), at least half of them with LS at risk (its slack under 5%, where the loop itself cuts) in
  that round or the FOLLOW after. Steal without LS harm, or on a node that is not full, is no reason.
  Only once it has watched for WATCH seconds (from its start, a hold's or a rest's end): the trial's
  "before" is its rate, and a burst of stalls in the first seconds read as a rate makes any quiet minute
  after it look like the ceiling's doing. memcached against cpu at 70% on 2 CPUs: three stolen rounds in
  koordd's first seconds began a trial that held BE to 0.35-0.52 CPUs through a window whose SLO was met;
- trial: the ceiling holds for as many rounds as make a trial without a stolen round evidence on its own
  (the binomial test below at EVIDENCE), n_before x (EVIDENCE^(-1/k_before) - 1), from MIN_TRIAL on;
  one that would last over MAX_TRIAL seconds is not started (the stalls are too rare to judge: wait for more);
- verdict: the trial bought latency when both its share of stolen rounds and its share of rounds with LS at
  risk are lower than in the binding rounds before, and one of the two beyond chance (one-sided: of all such
  rounds before and during, as few as the trial's fall into its share of the rounds with probability under
  SIGNIFICANT). Either, because stalls are few (3 or 4 before a trial: no stolen round in it is evidence, one
  is not) and rounds at risk more: in a real run stolen rounds went from 4 of 133 to 1 of 221 (chance 0.07)
  while LS at risk went from 11 of 133 to 2 of 221 (chance 0.001); the stolen rounds alone had called that
  "bought nothing". The rounds before hold those that started the trial, so their share at risk is high by
  selection and part of a fall is that rather than the ceiling. A trial that bought latency is kept for HOLD
  seconds (doubling each time in a row, up to HOLD_MAX) and released: a standing ceiling is re-tested by
  going without it, and tried again only if the stalls and LS's risk come back together. Otherwise it bought
  nothing: released at once, and resting REST seconds (doubling each time in a row, up to REST_MAX).

Do no harm: it takes at most `percent` of the node from BE, and only while LS and the system leave BE more
than that; it is tried only where the host was seen taking busy vCPUs while LS was at risk; one that bought
nothing costs at most MAX_TRIAL seconds of that share, then rests at least as long (REST >= MAX_TRIAL), so
over any stretch the trials that fail cost BE at most half of `percent` of the node, less with each one in a
row. Pure policy: the loop feeds one round at a time; no I/O; its state is plain data.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

STOLEN_MS = 50.0          # a round's steal (the vCPU that lost the most) this long is a host stall, not tick noise
WATCH = 300.0             # seconds of rounds the trigger and the trial's "before" count over
TRIGGER = 3               # stolen binding rounds in WATCH that start a trial ...
FOLLOW = 3                # ... half of them with LS at risk in that round or this many after
EVIDENCE = 0.02           # a trial is long enough that no stolen round in it would be this unlikely by chance
SIGNIFICANT = 0.05        # the verdict's one-sided test
MIN_TRIAL = 60            # rounds
MAX_TRIAL = 600.0         # seconds
HOLD, HOLD_MAX = 600.0, 3600.0
REST, REST_MAX = 600.0, 4800.0

WATCHING, TRIAL, KEPT, RESTING = "watching", "trial", "kept", "resting"


@dataclass
class Counts:
    """Rounds, of them stolen, of them with LS at risk."""
    rounds: int = 0
    stolen: int = 0
    at_risk: int = 0

    def risk_share(self) -> float:
        return self.at_risk / self.rounds if self.rounds else 0.0

    def fields(self) -> dict:
        return {"rounds": self.rounds, "stolen": self.stolen, "at_risk": self.at_risk}


@dataclass(frozen=True)
class Event:
    """A change of phase, for the decision: `step` names it, `text` says it."""
    step: str
    text: str


@dataclass
class Headroom:
    rounds: deque = field(default_factory=deque)      # (time, stolen, binding, at_risk) over WATCH
    phase: str = WATCHING
    until: float = 0.0                                  # KEPT or RESTING: till then
    trial_rounds: int = 0                               # TRIAL: how many rounds it lasts
    started: float = 0.0
    before: Counts = field(default_factory=Counts)      # the binding rounds over WATCH before the trial
    during: Counts = field(default_factory=Counts)
    kept_in_row: int = 0
    failed_in_row: int = 0
    last: str | None = None                             # the last verdict, as said
    watched_since: float | None = None                  # WATCHING: the first round of this watch

    @property
    def held(self) -> bool:
        return self.phase in (TRIAL, KEPT)

    def observe(self, now: float, stolen: bool, binding: bool, at_risk: bool) -> Event | None:
        """One round: a vCPU lost STOLEN_MS or more (`stolen`), BE used more than the ceiling allows
        (`binding`), LS was at risk (`at_risk`: the loop's slack under 5%). Returns the change of phase it
        brings, if any."""
        if self.phase == TRIAL:
            self.during.rounds += 1
            self.during.stolen += stolen
            self.during.at_risk += at_risk
            if self.during.rounds >= self.trial_rounds or now - self.started >= MAX_TRIAL:
                return self._verdict(now)
            return None
        if self.phase in (KEPT, RESTING):
            if now < self.until:
                return None
            was = self.phase
            self._watch()             # what came before the hold or the rest described another state
            if was == KEPT:
                return Event("headroom released", "headroom released to test it: re-tried if the host takes busy "
                             "vCPUs again")
            return None
        if self.watched_since is None:
            self.watched_since = now
        self.rounds.append((now, stolen, binding, at_risk))
        while self.rounds and self.rounds[0][0] < now - WATCH:
            self.rounds.popleft()
        return self._trigger(now)

    def abandon(self, why: str) -> Event | None:
        """A held ceiling goes without a verdict (no LS cgroup to protect, the lever turned off, steal unknown)."""
        if not self.held:
            return None
        self._watch()
        return Event("headroom released", f"headroom released: {why}")

    def _watch(self) -> None:
        """Watch again from a clean slate: the next round starts the WATCH seconds the trigger waits for."""
        self.phase, self.watched_since = WATCHING, None
        self.rounds.clear()

    def _trigger(self, now: float) -> Event | None:
        if now - self.watched_since < WATCH:
            return None           # no rate yet: a burst in the first seconds is not one
        marks = list(self.rounds)
        stolen = [i for i, (_, s, b, _) in enumerate(marks) if s and b]
        if len(stolen) < TRIGGER:
            return None
        harmed = sum(any(m for _, _, _, m in marks[i:i + FOLLOW + 1]) for i in stolen)
        if 2 * harmed < len(stolen):
            return None
        binding = [m for m in marks if m[2]]
        before = Counts(len(binding), len(stolen), sum(m for *_, m in binding))
        length = max(MIN_TRIAL, math.ceil(before.rounds * (EVIDENCE ** (-1 / before.stolen) - 1)))
        spacing = (marks[-1][0] - marks[0][0]) / max(len(marks) - 1, 1)
        if length * spacing > MAX_TRIAL:
            return None           # too rare to judge within MAX_TRIAL: wait for more
        self.phase, self.started, self.trial_rounds = TRIAL, now, length
        self.before, self.during = before, Counts()
        return Event("headroom trial",
                     f"headroom trial for {length} rounds: the host took a busy vCPU for {STOLEN_MS:g} ms or more in "
                     f"{before.stolen} of {before.rounds} rounds where BE filled the node, LS at risk after {harmed}")

    def _verdict(self, now: float) -> Event:
        b, d = self.before, self.during
        share = d.rounds / (b.rounds + d.rounds)
        p_stolen = binomial_cdf(d.stolen, b.stolen + d.stolen, share)
        p_risk = binomial_cdf(d.at_risk, b.at_risk + d.at_risk, share)
        rates = (f"stolen in {b.stolen} of {b.rounds} rounds -> {d.stolen} of {d.rounds} (chance {p_stolen:.2f}), LS "
                 f"at risk in {b.risk_share():.0%} -> {d.risk_share():.0%} of them (chance {p_risk:.2f})")
        fell = d.stolen / d.rounds < b.stolen / b.rounds and d.risk_share() < b.risk_share()
        if fell and min(p_stolen, p_risk) < SIGNIFICANT:
            hold = min(HOLD * 2 ** self.kept_in_row, HOLD_MAX)
            self.kept_in_row, self.failed_in_row = self.kept_in_row + 1, 0
            self.phase, self.until = KEPT, now + hold
            self.last = f"bought: {rates}"
            return Event("headroom kept", f"headroom bought latency: {rates}; held {hold:g}s, then re-tested")
        rest = min(REST * 2 ** self.failed_in_row, REST_MAX)
        self.failed_in_row, self.kept_in_row = self.failed_in_row + 1, 0
        self.phase, self.until = RESTING, now + rest
        self.last = f"bought nothing: {rates}"
        return Event("headroom undone", f"headroom bought nothing: {rates}; released, rests {rest:g}s")

    def fields(self, ceiling: float | None, now: float) -> dict:
        """For decisions and the loop's report; `left_s`: how long a hold or a rest has to go (the loop's clock
        is monotonic, meaningless to a reader)."""
        out = {"phase": self.phase, "ceiling": None if ceiling is None or not self.held else round(ceiling, 3),
               "before": self.before.fields(), "during": self.during.fields(), "last": self.last}
        if self.phase in (KEPT, RESTING):
            out["left_s"] = round(max(self.until - now, 0.0), 1)
        return out


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p): the chance that as few as k of n events fall in a share p of the
    rounds, were the rate the same throughout."""
    if n <= 0 or k >= n:
        return 1.0
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))
