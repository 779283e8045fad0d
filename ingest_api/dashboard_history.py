"""Each subscription's last 15 minutes for the dashboard's charts: delivered and dead-lettered
messages per second and the lag, from the totals of successive snapshots.

The dashboard samples every subscription's totals every SAMPLE_S whether or not a page is open
(Dashboard.sample), so a page opened now draws the quarter hour before it; each snapshot a page
asks for is a sample too. The rates are the change of the totals
between two samples over the time between them; a total that went down (dead letters replayed,
a topic re-created) counts as no messages, not as a negative rate.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any

HISTORY_S = 900.0
SAMPLE_S = 15.0


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # time.time()
    delivered: int
    dead_lettered: int
    lag: int


class SubscriptionHistory:
    def __init__(self, history_s: float = HISTORY_S, min_spacing_s: float = SAMPLE_S / 2) -> None:
        self.history_s = history_s
        self.min_spacing_s = min_spacing_s  # snapshots asked for by pages in between add no sample
        self._samples: dict[str, deque[Sample]] = {}

    def observe(self, name: str, sample: Sample) -> None:
        ring = self._samples.setdefault(name, deque())
        if ring and sample.at - ring[-1].at < self.min_spacing_s:
            return
        ring.append(sample)
        while ring and sample.at - ring[0].at > self.history_s:
            ring.popleft()

    def series(self, name: str) -> dict[str, list[Any]]:
        """Per interval between two samples: its end (epoch s), delivered and dead-lettered per
        second over it, and the lag at its end."""
        ring = list(self._samples.get(name, ()))
        out: dict[str, list[Any]] = {"at": [], "delivered_per_s": [], "dead_lettered_per_s": [], "lag": []}
        for before, after in itertools.pairwise(ring):
            dt = after.at - before.at
            out["at"].append(round(after.at, 3))
            out["delivered_per_s"].append(round(max(0, after.delivered - before.delivered) / dt, 2))
            out["dead_lettered_per_s"].append(round(max(0, after.dead_lettered - before.dead_lettered) / dt, 2))
            out["lag"].append(after.lag)
        return out

    def forget_except(self, names: set[str]) -> None:
        for name in set(self._samples) - names:
            del self._samples[name]
