"""An SLO's latency from the service's own Prometheus histogram (`[classes.slo] source = "prometheus"`).

A worker thread scrapes the declared `url` every second (SCRAPE_INTERVAL; at most TIMEOUT seconds each, so a
slow target never stalls a round: the round reads the latest completed scrape), keeps the `<metric>_bucket`
series whose labels match the declared `labels` exactly (several are summed per bucket, as `sum by (le)`),
and each round takes the buckets' deltas since the round before: quantiles interpolated linearly within
their bucket (bounds in seconds, as Prometheus' histogram_quantile does: one in the +Inf bucket is the
largest finite bound), and the same counts spread evenly over log2-µs slots for core/health.py. A failed,
refused, oversized or garbled scrape, or a counter reset, leaves the round without an entry: unknown,
never healthy; one log line per kind of failure. Only the declared URL is asked: no proxy, no redirect.

The exchange is koordd/kernel/netpeer.py's: TIMEOUT seconds all told, name lookup to last byte, and a
stop ends it at once. The answer is read as bytes and only the lines of the wanted `_bucket` series are
decoded and parsed (family_lines): the cost of a scrape is a C-speed search of at most MAX_BODY bytes
plus at most MAX_LINES parsed lines. Counts are finite numbers up to MAX_COUNT and bounds are clamped to
the slots' range, so no figure a target answers overflows the arithmetic of a round.
"""
from __future__ import annotations

import math
import time
from typing import Mapping
from urllib.parse import urlsplit

from koordd.core.slo import SOURCES, SloTarget
from koordd.core.histogram import slot_upper_us
from koordd.core.snapshot import AppLatency
from koordd.kernel.netpeer import Deadline, PeerError, Resolver, http_exchange
from koordd.sensors.declared import SLOTS, DeclaredSourceSensor, Worker, log, spread, summarize, whole

SCRAPE_INTERVAL = 1.0       # seconds between scrapes
TIMEOUT = 2.0               # seconds a scrape may take, all of it
MAX_BODY = 8 << 20          # bytes of an answer read at most: a larger one is a failure
MAX_BUCKETS = 256           # distinct bucket bounds at most
CPU_BUDGET = 0.02           # of one CPU a source's scrapes may cost: a costlier answer stretches the interval
MAX_LINES = 8192            # lines of the wanted series parsed at most (their bucket lines, all series)
MAX_COUNT = float(2 ** 53)  # a count past this is no integer a float holds: garbled
TOP_US = slot_upper_us(SLOTS - 1)   # latencies are clamped to the slots' top (2^31 µs, about 36 min)

Buckets = tuple[tuple[float, float], ...]      # (upper bound in seconds, cumulative count), by bound


class ScrapeError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _labels(text: str, i: int) -> tuple[dict[str, str], int]:
    """The label set starting at text[i] == "{": (labels, index after "}"); ValueError when garbled."""
    out: dict[str, str] = {}
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == "}":
            return out, i + 1
        j = i
        while j < n and (text[j].isalnum() or text[j] == "_") and text[j].isascii():
            j += 1
        name = text[i:j]
        if not name or name[0].isdigit() or text[j:j + 2] != '="':
            raise ValueError("bad label")
        j += 2
        value = []
        while True:
            if j >= n:
                raise ValueError("unterminated label value")
            c = text[j]
            if c == "\\":
                if j + 1 >= n:
                    raise ValueError("bad escape")
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(text[j + 1], "\\" + text[j + 1]))
                j += 2
            elif c == '"':
                j += 1
                break
            else:
                value.append(c)
                j += 1
        if name in out:
            raise ValueError(f"label {name} twice")
        out[name] = "".join(value)
        while j < n and text[j] in " \t":
            j += 1
        if j < n and text[j] == ",":
            j += 1
        elif j >= n or text[j] != "}":
            raise ValueError("expected , or }")
        i = j


def _number(text: str) -> float:
    v = float(text)         # "+Inf", "NaN" and Go's forms float() reads; ValueError otherwise
    return v


def _escaped(value: str) -> str:
    """A label value as the text format writes it (the only escapes it has: backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def family_lines(body: bytes, name: str, needles: tuple[bytes, ...] = ()) -> list[bytes]:
    """The lines of `body` that start with the sample name `name` (then "{", a space or a tab) and contain
    every one of `needles`, without the name. Found with bytes.find and bytes.count (C speed), walking the
    occurrences of whichever is rarer in the answer, the name at a line's start or a needle: the rest of
    the answer, however large, is never split, decoded or parsed in Python. ScrapeError("too large") past
    MAX_LINES such lines."""
    key = name.encode()
    n = len(key)
    out: list[bytes] = []
    line_key = b"\n" + key
    walk = min((line_key, *needles), key=body.count)
    if walk is line_key:
        pos = -1 if body.startswith(key) else body.find(line_key)       # -1: the first line
        if pos < 0 and not body.startswith(key):
            return out
    elif (pos := body.find(walk)) < 0:
        return out
    while True:
        start = pos + 1 if walk is line_key else body.rfind(b"\n", 0, pos) + 1
        end = body.find(b"\n", max(pos, start))
        if end < 0:
            end = len(body)
        if body.startswith(key, start) and body[start + n:start + n + 1] in (b"{", b" ", b"\t"):
            line = body[start + n:end]
            if all(x in line for x in needles):
                out.append(line.rstrip(b"\r"))
                if len(out) > MAX_LINES:
                    raise ScrapeError("too large", f"more than {MAX_LINES} {name} lines match")
        if end >= len(body):
            break
        pos = body.find(walk, end)
        if pos < 0:
            break
    return out


def parse_buckets(text: str | bytes, metric: str, labels: Mapping[str, str] | tuple = ()) -> Buckets:
    """The cumulative buckets of `metric`'s histogram series whose labels match `labels` exactly, summed per
    bound, from a text exposition. Only the lines of `<metric>_bucket` that contain each wanted
    `label="value"` are decoded and parsed (family_lines). ScrapeError("garbled") for such a line that
    cannot be read, a count that is not a finite number from 0 to MAX_COUNT, or buckets that do not add up;
    ScrapeError("no series") where no series matches."""
    want = dict(labels)
    name = metric + "_bucket"
    body = text.encode() if isinstance(text, str) else text
    needles = tuple(f'{k}="{_escaped(v)}"'.encode() for k, v in want.items())
    sums: dict[float, float] = {}
    for raw in family_lines(body, name, needles):
        try:
            rest = raw.decode("utf-8")
            got, i = _labels(rest, 0) if rest.startswith("{") else ({}, 0)
            fields = rest[i:].split()
            if not 1 <= len(fields) <= 2:
                raise ValueError("expected a value and at most a timestamp")
            value = _number(fields[0])
            if not 0 <= value <= MAX_COUNT:        # NaN, inf and a count past float's integers
                raise ValueError(f"count {fields[0]}")
            le = _number(got["le"]) if "le" in got else None
            if le is None or math.isnan(le):
                raise ValueError("no le label")
        except UnicodeDecodeError:
            raise ScrapeError("garbled", f"a {name} line is not UTF-8") from None
        except (ValueError, KeyError) as e:
            raise ScrapeError("garbled", f"a line of {name} cannot be read ({e}): {raw[:80]!r}") from None
        if any(got.get(k) != v for k, v in want.items()):
            continue
        sums[le] = sums.get(le, 0.0) + value
        if len(sums) > MAX_BUCKETS:
            raise ScrapeError("garbled", f"more than {MAX_BUCKETS} bucket bounds")
    if not sums:
        raise ScrapeError("no series", f"no {name} series matches {want or 'any labels'}")
    out = tuple(sorted(sums.items()))
    if any(b[1] < a[1] for a, b in zip(out, out[1:])):
        raise ScrapeError("garbled", f"{name}'s cumulative counts fall as the bound grows")
    return out


def bucket_quantile(counts: Buckets, q: float) -> float | None:
    """The q-quantile (seconds) of non-cumulative bucket counts (upper bound, count), interpolated linearly
    within its bucket (the first from 0); in the +Inf bucket, the largest finite bound. None: no event."""
    total = sum(n for _, n in counts)
    if total <= 0:
        return None
    rank, seen, lower = q * total, 0.0, 0.0
    finite = [b for b, _ in counts if math.isfinite(b)]
    for upper, n in counts:
        if n > 0 and seen + n >= rank:
            if not math.isfinite(upper):
                return finite[-1] if finite else None
            lo = min(lower, upper) if lower >= 0 else 0.0
            return lo + (upper - lo) * max(rank - seen, 0) / n
        seen += n
        lower = upper
    return finite[-1] if finite else None


def latency(before: Buckets, after: Buckets) -> AppLatency | None:
    """The AppLatency of the events between two scrapes (the same bounds, none fewer); None without one."""
    cum = [(b, n - dict(before).get(b, 0.0)) for b, n in after]
    counts, prev = [], 0.0
    for b, c in cum:
        counts.append((b, max(c - prev, 0.0)))
        prev = max(prev, c)
    counts = tuple(counts)
    total = sum(n for _, n in counts)
    if total <= 0:
        return None
    top_s = TOP_US / 1e6
    clamp = lambda s: min(max(s, 0.0), top_s)  # noqa: E731 - a bound of 1e303 s is the slots' top
    finite = [b for b, _ in counts if math.isfinite(b)]
    top = clamp(finite[-1]) if finite else 0.0
    slots = [0.0] * SLOTS
    lower, total_us, max_s = 0.0, 0.0, 0.0
    for upper, n in counts:
        lo_s, hi_s = (clamp(lower), clamp(upper)) if math.isfinite(upper) else (top, top)
        lo_s = min(lo_s, hi_s)
        spread(slots, lo_s * 1e6, hi_s * 1e6, n)
        total_us += n * (lo_s + hi_s) / 2 * 1e6
        if n > 0:
            max_s = hi_s
        lower = upper
    us = lambda q: None if (v := bucket_quantile(counts, q)) is None else min(max(v * 1e6, 0.0), TOP_US)  # noqa: E731
    return summarize(whole(slots), total_us, int(round(total)), us(0.5), us(0.99), us(0.999), max_s * 1e6)


def scrape(url: str, timeout: float = TIMEOUT, cancel=None, resolver: Resolver | None = None) -> bytes:
    """The answer at `url` (http only, no proxy, no redirect), within `timeout` seconds all told (name
    lookup, connect, head and body); ScrapeError naming the kind of failure ("cancelled": stopped)."""
    try:
        got = http_exchange(url, Deadline(timeout, cancel), max_body=MAX_BODY, resolver=resolver,
                            headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "koordd"})
    except PeerError as e:
        if e.kind == "timeout":
            raise ScrapeError("timeout", f"{url} took over {timeout:g}s") from None
        if e.kind == "too large":
            raise ScrapeError("too large", f"{url} answered over {MAX_BODY >> 20} MiB") from None
        raise ScrapeError(e.kind if e.kind in ("cancelled", "dns") else "unreachable", f"{url}: {e}") from None
    if got.status != 200:
        raise ScrapeError("http status", f"{url} answered HTTP {got.status}")
    return got.body


class Scraper(Worker):
    def __init__(self, target: SloTarget, interval: float = SCRAPE_INTERVAL, timeout: float = TIMEOUT):
        super().__init__(target, f"prometheus {target.url} {target.metric}")
        self.interval, self.timeout = interval, timeout
        self.base: Buckets | None = None        # the buckets at the last round (or since a reset)
        self.last: Buckets | None = None        # the latest completed scrape's
        self.unknown = True                     # the latest scrape failed (or none completed)
        self.costly = False                     # the interval is stretched (CPU_BUDGET)

    def measure(self) -> None:
        while not self.halt.is_set():
            began, cpu = time.monotonic(), time.thread_time()
            try:
                self.once()
            except Exception as e:  # noqa: BLE001 - nothing a target answers may end the worker
                with self.lock:
                    self.unknown = True
                self.failed("error", f"scrape failed: {e!r}")
            self.halt.wait(self.pause(time.monotonic() - began, time.thread_time() - cpu))

    def pause(self, elapsed: float, cpu: float) -> float:
        """Seconds to the next scrape: the interval's rest, stretched so that scraping costs at most
        CPU_BUDGET of a CPU whatever the target answers (one log line while it is stretched)."""
        spacing = max(self.interval, cpu / CPU_BUDGET)
        if (spacing > self.interval) != self.costly:
            self.costly = spacing > self.interval
            if self.costly:
                log.warning("SLO source %s: a scrape costs %.0f ms of CPU; scraped every %.1fs instead of %gs "
                            "(at most %g%% of a CPU) while its answers cost that much", self.name, cpu * 1e3,
                            spacing, self.interval, CPU_BUDGET * 100)
            else:
                log.info("SLO source %s: scraped every %gs again", self.name, self.interval)
        return max(spacing - elapsed, 0.01)

    def once(self) -> None:
        try:
            got = parse_buckets(scrape(self.target.url, self.timeout, self.halt, self.resolver),
                                self.target.metric, self.target.labels)
        except ScrapeError as e:
            with self.lock:
                self.unknown = True
            if e.kind != "cancelled":
                self.failed(e.kind, str(e))
            return
        with self.lock:
            if self.last is not None and ([b for b, _ in got] != [b for b, _ in self.last]
                                          or any(n < m for (_, n), (_, m) in zip(got, self.last))):
                self.base, self.last, self.unknown = got, got, True     # a reset (or new bounds): start again
                reset = True
            else:
                self.base = self.base if self.base is not None else got
                self.last, self.unknown, reset = got, False, False
        if reset:
            self.failed("reset", "the histogram's counters were reset (or its buckets changed)")
        else:
            self.recovered()

    def take(self) -> AppLatency | None:
        with self.lock:
            if self.unknown or self.last is None or self.base is None:
                return None
            before, after = self.base, self.last
            self.base = after
        return latency(before, after)


class SloPrometheusSensor(DeclaredSourceSensor):
    """Section SOURCES["prometheus"]: class root -> AppLatency of the round, from the histogram its SLO declares."""
    name = SOURCES["prometheus"]
    source = "prometheus"
    features = {}

    def worker(self, target: SloTarget) -> Worker:
        return Scraper(target, SCRAPE_INTERVAL, TIMEOUT)
