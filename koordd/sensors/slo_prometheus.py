"""An SLO's latency from the service's own Prometheus histogram (`[classes.slo] source = "prometheus"`).

A worker thread scrapes the declared `url` every second (SCRAPE_INTERVAL; at most TIMEOUT seconds each, so a
slow target never stalls a round: the round reads the latest completed scrape), keeps the `<metric>_bucket`
series whose labels match the declared `labels` exactly (several are summed per bucket, as `sum by (le)`),
and each round takes the buckets' deltas since the round before: quantiles interpolated linearly within
their bucket (bounds in seconds, as Prometheus' histogram_quantile does: one in the +Inf bucket is the
largest finite bound), and the same counts spread evenly over log2-µs slots for core/health.py. A failed,
refused, oversized or garbled scrape, or a counter reset, leaves the round without an entry: unknown,
never healthy; one log line per kind of failure. Only the declared URL is asked: no proxy, no redirect.
"""
from __future__ import annotations

import http.client
import math
import socket
import time
from typing import Mapping
from urllib.parse import urlsplit

from koordd.core.slo import SOURCES, SloTarget
from koordd.core.snapshot import AppLatency
from koordd.sensors.declared import SLOTS, DeclaredSourceSensor, Worker, spread, summarize, whole

SCRAPE_INTERVAL = 1.0       # seconds between scrapes
TIMEOUT = 2.0               # seconds a scrape may take, all of it
MAX_BODY = 8 << 20          # bytes of an answer read at most: a larger one is a failure
MAX_BUCKETS = 256           # distinct bucket bounds at most

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


def parse_buckets(text: str, metric: str, labels: Mapping[str, str] | tuple = ()) -> Buckets:
    """The cumulative buckets of `metric`'s histogram series whose labels match `labels` exactly, summed per
    bound, from a text exposition. ScrapeError("garbled") for a bucket line that cannot be read or buckets
    that do not add up; ScrapeError("no series") where no series matches."""
    want = dict(labels)
    name = metric + "_bucket"
    sums: dict[float, float] = {}
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " ", "\t"):
            continue
        try:
            rest = line[len(name):]
            got, i = _labels(rest, 0) if rest.startswith("{") else ({}, 0)
            fields = rest[i:].split()
            if not 1 <= len(fields) <= 2:
                raise ValueError("expected a value and at most a timestamp")
            value = _number(fields[0])
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"count {fields[0]}")
            le = _number(got["le"]) if "le" in got else None
            if le is None or math.isnan(le):
                raise ValueError("no le label")
        except (ValueError, KeyError) as e:
            raise ScrapeError("garbled", f"line {lineno} of {name} cannot be read ({e})") from None
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
    finite = [b for b, _ in counts if math.isfinite(b)]
    top = finite[-1] if finite else 0.0
    slots = [0.0] * SLOTS
    lower, total_us, max_s = 0.0, 0.0, 0.0
    for upper, n in counts:
        lo_s, hi_s = (max(lower, 0.0), upper) if math.isfinite(upper) else (top, top)
        lo_s = min(lo_s, hi_s)
        spread(slots, lo_s * 1e6, hi_s * 1e6, n)
        total_us += n * (lo_s + hi_s) / 2 * 1e6
        if n > 0:
            max_s = hi_s
        lower = upper
    us = lambda q: None if (v := bucket_quantile(counts, q)) is None else v * 1e6  # noqa: E731
    return summarize(whole(slots), total_us, int(round(total)), us(0.5), us(0.99), us(0.999), max_s * 1e6)


def scrape(url: str, timeout: float = TIMEOUT) -> str:
    """The text at `url` (http only, no proxy, no redirect), within `timeout` seconds all told."""
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "koordd"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ScrapeError("http status", f"{url} answered HTTP {resp.status}")
        chunks, size = [], 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ScrapeError("timeout", f"{url} took over {timeout:g}s")
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = resp.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_BODY:
                raise ScrapeError("too large", f"{url} answered over {MAX_BODY >> 20} MiB")
            chunks.append(chunk)
        try:
            return b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError:
            raise ScrapeError("garbled", f"{url} answered text that is not UTF-8") from None
    except ScrapeError:
        raise
    except (socket.timeout, TimeoutError):
        raise ScrapeError("timeout", f"{url} took over {timeout:g}s") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise ScrapeError("unreachable", f"{url}: {e or type(e).__name__}") from None
    finally:
        conn.close()


class Scraper(Worker):
    def __init__(self, target: SloTarget, interval: float = SCRAPE_INTERVAL, timeout: float = TIMEOUT):
        super().__init__(target, f"prometheus {target.url} {target.metric}")
        self.interval, self.timeout = interval, timeout
        self.base: Buckets | None = None        # the buckets at the last round (or since a reset)
        self.last: Buckets | None = None        # the latest completed scrape's
        self.unknown = True                     # the latest scrape failed (or none completed)

    def run(self) -> None:
        while not self.halt.is_set():
            began = time.monotonic()
            try:
                self.once()
            except Exception as e:  # noqa: BLE001 - nothing a target answers may end the worker
                with self.lock:
                    self.unknown = True
                self.failed("error", f"scrape failed: {e!r}")
            self.halt.wait(max(self.interval - (time.monotonic() - began), 0.01))

    def once(self) -> None:
        try:
            got = parse_buckets(scrape(self.target.url, self.timeout), self.target.metric, self.target.labels)
        except ScrapeError as e:
            with self.lock:
                self.unknown = True
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
