"""What the daemon publishes in its state_dir for koordctl, and what koordctl writes there to ask: the
file names and the top view's request. Both sides import this; neither imports the other's code.

status.json: the daemon's status, rewritten every round. top.json: the samples a `koordctl top` asked
for (koordd/runtime/topfeed.py writes it, koordctl/top.py reads it), while top.request, which the view
keeps fresh, asks for them."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

STATUS_FILE = "status.json"
REQUEST_FILE = "top.request"
TOP_FILE = "top.json"
MIN_INTERVAL = 0.5        # whatever a request says, koordd samples for a view at most this often
MAX_INTERVAL = 60.0       # and a request outlives the view that wrote it by 3 intervals at most
DEFAULT_INTERVAL = 2.0
FRESH_INTERVALS, FRESH_AT_LEAST = 3, 5.0


@dataclass(frozen=True)
class TopRequest:
    interval: float = DEFAULT_INTERVAL     # seconds between two published rounds
    members: bool = False                  # the class roots' children (pods) too

    @property
    def fresh_for(self) -> float:
        """How long after its last touch the request still holds: a view that stopped touching it is gone."""
        return max(FRESH_INTERVALS * self.interval, FRESH_AT_LEAST)


def parse_request(text: str) -> TopRequest:
    """The request in `text`; one koordd cannot make sense of still asks, with the defaults."""
    try:
        data = json.loads(text)
        interval, members = float(data.get("interval", DEFAULT_INTERVAL)), data.get("members", False) is True
    except (ValueError, TypeError, AttributeError, OverflowError):     # OverflowError: an int past float's range
        return TopRequest()
    return TopRequest(min(max(interval, MIN_INTERVAL), MAX_INTERVAL) if math.isfinite(interval) else DEFAULT_INTERVAL,
                      members)

