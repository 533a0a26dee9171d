"""What `koordctl demo` measures and shows: its samples, the live view (bars redrawn in place on a
terminal, a line per second anywhere else), the summary per phase, and the PNG plot (with matplotlib,
where it is installed)."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TextIO

PHASES = ("LS alone", "no control", "koordd on")
PHASE_TEXT = ("only LS runs", "BE busy on every CPU, nothing controls it", "koordd manages BE")
FULL, EMPTY = "█", "·"


@dataclass(frozen=True)
class Sample:
    """One window of `dt` seconds ending `t` seconds into the demo; CPU use in CPUs (cores)."""
    t: float
    dt: float
    phase: int                   # index into PHASES
    ls_asked: float
    ls_used: float
    be_used: float
    other: float                 # the node's busy CPUs outside the demo's cgroups (koordd included)
    be_quota: float | None       # BE's cpu.max in CPUs; None: no quota
    be_idle: bool | None         # BE's cpu.idle; None where the host has no cpu.idle


# --- the live view --------------------------------------------------------------------------------------

def bar(cpus: float, ncpu: int, width: int) -> str:
    """`cpus` of `ncpu` as a bar `width` characters long (rounded to the nearest character)."""
    filled = min(width, max(0, round(cpus / ncpu * width))) if ncpu > 0 else 0
    return FULL * filled + EMPTY * (width - filled)


def be_limit_text(s: Sample) -> str:
    parts = []
    if s.be_quota is not None:
        parts.append(f"cpu.max {s.be_quota:.2f} CPUs")
    if s.be_idle:
        parts.append("cpu.idle 1 (SCHED_IDLE)")
    return ", ".join(parts) or "no limit"


def frame(s: Sample, ncpu: int, phase_seconds: float, koordd: str, width: int = 80) -> list[str]:
    """The live view of one sample: phase, time, LS asked and used, BE used, other work, koordd."""
    bar_width = max(10, min(50, width - 42))      # what is left of the widest line (LS uses) for its bar
    into = s.t - s.phase * phase_seconds
    got = f"{s.ls_used / s.ls_asked:4.0%} of what it asks" if s.ls_asked > 0 else ""
    lines = [
        f"koordctl demo: phase {s.phase + 1}/{len(PHASES)} {PHASES[s.phase]} ({PHASE_TEXT[s.phase]}), "
        f"{into:4.1f}s of {phase_seconds:g}s",
        "",
        f"LS asks  {bar(s.ls_asked, ncpu, bar_width)} {s.ls_asked:5.2f} CPUs",
        f"LS uses  {bar(s.ls_used, ncpu, bar_width)} {s.ls_used:5.2f} CPUs  {got}",
        f"BE uses  {bar(s.be_used, ncpu, bar_width)} {s.be_used:5.2f} CPUs",
        f"other    {bar(s.other, ncpu, bar_width)} {s.other:5.2f} CPUs  rest of the node",
        "",
        f"BE limit: {be_limit_text(s)}",
        f"koordd: {koordd}",
        "Ctrl-C stops the demo and removes everything it made.",
    ]
    return [line[:width] for line in lines]


def line(s: Sample) -> str:
    """One sample as one line, for a log or a pipe."""
    return (f"{s.t:6.1f}s  {PHASES[s.phase]:<10}  LS asks {s.ls_asked:4.2f} uses {s.ls_used:4.2f}  "
            f"BE uses {s.be_used:4.2f} ({be_limit_text(s)})  other {s.other:4.2f} CPUs")


class LiveView:
    """A terminal: each frame drawn over the last one with ANSI sequences, in the normal screen so the
    last frame stays in view above the summary; the cursor hidden meanwhile and shown again on exit."""

    def __init__(self, out: TextIO):
        self.out, self.height = out, 0

    def __enter__(self) -> "LiveView":
        self.out.write("\x1b[?25l")
        self.out.flush()
        return self

    def __exit__(self, *exc) -> None:
        self.out.write("\x1b[?25h\n" if self.height else "\x1b[?25h")
        self.out.flush()

    def width(self) -> int:
        """Asked at every frame: the window may have been resized. One column spare: a line exactly as
        wide as the terminal wraps on some, and would move every later frame down."""
        return shutil.get_terminal_size().columns - 1

    def show(self, lines: list[str]) -> None:
        up = f"\r\x1b[{self.height - 1}A" if self.height > 1 else "\r"
        self.out.write((up if self.height else "") + "\x1b[K\n".join(lines) + "\x1b[K\x1b[J")
        self.out.flush()
        self.height = len(lines)


class LinePrinter:
    """Not a terminal: one line per second (every other sample), nothing redrawn."""

    def __init__(self, out: TextIO, every: float = 1.0):
        self.out, self.every, self.next = out, every, every

    def __enter__(self) -> "LinePrinter":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def sample(self, s: Sample) -> None:
        if s.t + 1e-6 >= self.next:
            print(line(s), file=self.out, flush=True)
            self.next = (int((s.t + 1e-6) / self.every) + 1) * self.every


# --- the summary -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PhaseSummary:
    """Means over one phase, in CPUs."""
    phase: int
    seconds: float
    ls_asked: float
    ls_used: float
    be_used: float
    other: float

    ncpu: int

    @property
    def ls_got(self) -> float:
        """The part of what LS asked for that it got."""
        return self.ls_used / self.ls_asked if self.ls_asked > 0 else 0.0

    @property
    def left(self) -> float:
        """The CPUs LS and other work left over: all BE could have used."""
        return max(self.ncpu - self.ls_used - self.other, 0.0)

    @property
    def be_took(self) -> float:
        """The part of what was left over that BE used."""
        return min(self.be_used / self.left, 1.0) if self.left > 0 else 0.0


def summarize(samples: Sequence[Sample], ncpu: int) -> list[PhaseSummary]:
    """One summary per phase that has samples (a stopped demo has fewer), each mean weighted by time."""
    out = []
    for phase in range(len(PHASES)):
        mine = [s for s in samples if s.phase == phase]
        seconds = sum(s.dt for s in mine)
        if not mine or seconds <= 0:
            continue

        def mean(field: str) -> float:
            return sum(getattr(s, field) * s.dt for s in mine) / seconds
        out.append(PhaseSummary(phase, seconds, mean("ls_asked"), mean("ls_used"), mean("be_used"), mean("other"),
                                ncpu))
    return out


def summary_lines(summaries: Sequence[PhaseSummary]) -> list[str]:
    """A table per phase and what it says, in words."""
    rows = [("phase", "seconds", "LS asked", "LS used", "LS got", "BE used", "left over", "BE took", "other")]
    rows += [(PHASES[p.phase], f"{p.seconds:.0f}", f"{p.ls_asked:.2f}", f"{p.ls_used:.2f}", f"{p.ls_got:.0%}",
              f"{p.be_used:.2f}", f"{p.left:.2f}", f"{p.be_took:.0%}" if p.phase else "-", f"{p.other:.2f}")
             for p in summaries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"Means per phase, in CPUs of {summaries[0].ncpu} (left over: what LS and other work left to BE):"]
    lines += ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
              for r in rows]
    lines.append("")
    for p in summaries:
        text = f"{PHASES[p.phase]}: LS got {p.ls_got:.0%} of what it asked"
        if p.phase:
            text += f"; BE used {p.be_used:.2f} CPUs, {p.be_took:.0%} of the {p.left:.2f} left over"
        lines.append(text)
    return lines


# --- the plot ---------------------------------------------------------------------------------------------

def plot(samples: Sequence[Sample], ncpu: int, phase_seconds: float, title: str, path: Path) -> None:
    """LS asked, LS used and BE used over time, with BE's quota where it had one and the phases marked,
    as a PNG. ImportError when matplotlib is not installed."""
    import matplotlib
    matplotlib.use("Agg")               # files only: no display needed (and none under sudo or ssh)
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=100)
    try:
        ax.plot(t, [s.ls_asked for s in samples], "--", color="tab:blue", label="LS asked")
        ax.plot(t, [s.ls_used for s in samples], color="tab:blue", linewidth=2, label="LS used")
        ax.plot(t, [s.be_used for s in samples], color="tab:orange", linewidth=2, label="BE used")
        if any(s.be_quota is not None for s in samples):
            ax.plot(t, [s.be_quota for s in samples], ":", color="tab:red", label="BE quota (cpu.max)")
        ax.plot(t, [s.other for s in samples], color="tab:gray", linewidth=1, label="other work")
        for phase, name in enumerate(PHASES):
            start = phase * phase_seconds
            if phase:
                ax.axvline(start, color="black", linewidth=0.8)
            ax.text(start + phase_seconds / 2, ncpu * 1.07, name, ha="center", va="center")
        ax.set_xlim(0, len(PHASES) * phase_seconds)
        ax.set_ylim(0, ncpu * 1.15)
        ax.set_xlabel("seconds")
        ax.set_ylabel(f"CPUs (of {ncpu})")
        ax.set_title(title)
        # Below the axes: inside, the legend would hide the curves at one phase or another.
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize="small", ncol=5, frameon=False)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
