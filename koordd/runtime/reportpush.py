"""The node report pushed as JSON to `[report] url` every `interval` (koordd/core/report.py, README "Node
report"), for a cluster scheduler's extender.

The main loop never waits for the receiver: after each round `published()` keeps the latest report (one
assignment), and a thread of its own POSTs it. A push that fails costs that push: one log line per kind of
failure (refused, timed out, HTTP 503...), not per attempt, and one line when pushes work again. A push
takes at most about `timeout` for each step (connect, send, the answer's head); the answer's body is
never read and a redirect never followed (http.client follows none).
"""
from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
from urllib.parse import urlsplit

from koordd.core.report import NodeReport
from koordd.runtime.result import RoundResult, Subscriber

log = logging.getLogger("koordd")

USER_AGENT = "koordd-report"


def post(url: str, body: bytes, timeout: float) -> None:
    """POST `body` to `url`; returns on a 2xx answer, else raises PushError naming the kind of failure."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=timeout, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                         "User-Agent": USER_AGENT, "Connection": "close"})
        status = conn.getresponse().status          # the head only: the body is ignored
    except (socket.timeout, TimeoutError):
        raise PushError(f"timed out after {timeout:g}s") from None
    except ssl.SSLError as e:
        raise PushError(f"TLS: {e.reason or e}") from None
    except ConnectionRefusedError:
        raise PushError("connection refused") from None
    except socket.gaierror as e:
        raise PushError(f"cannot resolve {parts.hostname}: {e.strerror or e}") from None
    except (OSError, http.client.HTTPException) as e:
        raise PushError(getattr(e, "strerror", None) or type(e).__name__) from None
    finally:
        conn.close()
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
        self.stop_event = threading.Event()
        self.failing: set[str] = set()              # kinds of failure logged since the last push that worked
        self.pushed = self.failed = 0
        self.timeout = 2.0                          # the running thread's [report] timeout

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
            self.stop_event = threading.Event()
            self.failing, self.timeout = set(), float(settings.timeout)
            self.thread = threading.Thread(target=self._run, args=(settings, self.stop_event),
                                           name="koordd-report", daemon=True)
            self.thread.start()
            log.info("report: pushing to %s every %gs", settings.url, settings.interval)

    def published(self, result: RoundResult) -> None:
        self.latest = result.report                 # one assignment: the thread sees the old one or the new one

    def stop(self) -> None:
        if self.thread is None:
            return
        self.stop_event.set()
        # A push in flight ends within its timeout (per step); a stop does not wait much longer for it.
        self.thread.join(timeout=self.timeout + 1)
        self.thread = None

    def _run(self, settings, stop: threading.Event) -> None:
        while not stop.wait(float(settings.interval)):
            report = self.latest
            if report is None:
                continue
            self.push_once(settings, report)

    def push_once(self, settings, report: NodeReport) -> bool:
        try:
            post(settings.url, json.dumps(report.as_dict()).encode(), float(settings.timeout))
        except PushError as e:
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
