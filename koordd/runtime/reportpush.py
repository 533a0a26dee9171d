"""The node report pushed as JSON to `[report] url` every `interval` (koordd/core/report.py, README "Node
report"), for a cluster scheduler's extender.

The main loop never waits for the receiver: after each round `published()` keeps the latest report (one
assignment), and a thread of its own POSTs it. A push that fails costs that push: one log line per kind of
failure (refused, timed out, HTTP 503...), not per attempt, and one line when pushes work again. A push
takes at most `timeout` all told (koordd/kernel/netpeer.py: name lookup, connect, TLS, send, the answer's
head), the answer's body is never read and a redirect never followed. stop() (a stop, or a reload that
changes [report]) cancels the push in flight and waits STOP_WAIT seconds at most for the thread to end,
whatever the receiver does: the main loop never waits on the receiver.
"""
from __future__ import annotations

import json
import logging
import threading
from urllib.parse import urlsplit

from koordd.core.report import NodeReport
from koordd.kernel.netpeer import Cancel, Deadline, PeerError, Resolver, http_exchange
from koordd.runtime.result import RoundResult, Subscriber

log = logging.getLogger("koordd")

USER_AGENT = "koordd-report"
STOP_WAIT = 1.0         # seconds stop() waits for the push thread to end


def post(url: str, body: bytes, timeout: float, cancel: Cancel | None = None,
         resolver: Resolver | None = None) -> None:
    """POST `body` to `url` within `timeout` seconds all told; returns on a 2xx answer, else raises
    PushError naming the kind of failure."""
    try:
        status = http_exchange(url, Deadline(timeout, cancel), method="POST", body=body, resolver=resolver,
                               headers={"Content-Type": "application/json", "User-Agent": USER_AGENT}).status
    except PeerError as e:
        if e.kind == "timeout":
            raise PushError(f"timed out after {timeout:g}s") from None
        if e.kind == "refused":
            raise PushError("connection refused") from None
        if e.kind == "dns":
            raise PushError(f"cannot resolve {urlsplit(url).hostname}") from None
        raise PushError(str(e)) from None
    if 300 <= status < 400:
        raise PushError(f"HTTP {status} (redirects are not followed)")
    if not 200 <= status < 300:
        raise PushError(f"HTTP {status}")


class PushError(Exception):
    """A push that failed; its text is the kind of failure (one log line per kind)."""


class ReportPusher(Subscriber):
    """Pushes the latest report while `[report] url` is set; `configure()` starts, moves or stops it."""

    def __init__(self):
        self.settings = None
        self.latest: NodeReport | None = None       # set by the main loop, read by the thread
        self.thread: threading.Thread | None = None
        self.stop_event = Cancel()                  # set by stop(): ends the wait and the push in flight
        self.failing: set[str] = set()              # kinds of failure logged since the last push that worked
        self.pushed = self.failed = 0
        self.resolver = Resolver()

    def configure(self, settings) -> None:
        """[report] as loaded: a changed url, interval or timeout restarts the thread (tenants are the
        round's)."""
        old, self.settings = self.settings, settings
        same = old is not None and (old.url, old.interval, old.timeout) == (settings.url, settings.interval,
                                                                          settings.timeout)
        if same and (self.thread is not None) == bool(settings.url):
            return
        self.stop()
        if settings.url:
            self.stop_event = Cancel()
            self.failing = set()
            self.thread = threading.Thread(target=self._run, args=(settings, self.stop_event),
                                           name="koordd-report", daemon=True)
            self.thread.start()
            log.info("report: pushing to %s every %gs", settings.url, settings.interval)

    def published(self, result: RoundResult) -> None:
        self.latest = result.report                 # one assignment: the thread sees the old one or the new one

    def stop(self) -> None:
        if self.thread is None:
            return
        self.stop_event.set()           # wakes the push in flight at once (netpeer's Cancel)
        self.thread.join(timeout=STOP_WAIT)
        if self.thread.is_alive():
            log.warning("report: the push thread did not end within %gs of the stop", STOP_WAIT)
        self.thread = None

    def _run(self, settings, stop: Cancel) -> None:
        try:
            while not stop.wait(float(settings.interval)):
                report = self.latest
                if report is None:
                    continue
                self.push_once(settings, report, stop)
        finally:
            stop.close()

    def push_once(self, settings, report: NodeReport, cancel: Cancel | None = None) -> bool:
        try:
            post(settings.url, json.dumps(report.as_dict()).encode(), float(settings.timeout), cancel,
                 self.resolver)
        except PushError as e:
            if cancel is not None and cancel.is_set():
                return False                    # stopped: no failure
            self.failed += 1
            if str(e) not in self.failing:
                log.warning("report: push to %s failed: %s (logged once until pushes work again; koordd "
                            "runs on)", settings.url, e)
                self.failing.add(str(e))
            return False
        except Exception:  # noqa: BLE001 - a bug here must cost the push, not the thread
            self.failed += 1
            if "error" not in self.failing:
                log.exception("report: push to %s failed", settings.url)
                self.failing.add("error")
            return False
        self.pushed += 1
        if self.failing:
            log.info("report: pushes to %s work again", settings.url)
            self.failing = set()
        return True
