"""A node's watch on its own clock, against the table storage's.

Leases are times: a node whose clock is further off than the leases tolerate (a quarter of the
TTL, tables/storage_clock.max_skew_s) could keep a partition after its lease ran out elsewhere,
or take one too early. Membership asks `look` before each heartbeat; while `off`, the node takes
no partitions and hands over those it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables.storage_clock import Skew, max_skew_s

log = logging.getLogger(__name__)
CLOCK_CHECK_S = 10.0  # how often a node compares its clock with the storage's


class ClockWatch:
    def __init__(self, probe: Callable[[], Awaitable[Skew]], lease_ttl_s: float, metrics: IngestMetrics,
                 changed: Callable[[], None]) -> None:
        self._probe = probe
        self._metrics = metrics
        self._changed = changed  # the verdict changed: the next heartbeat should come now
        self.max_skew_s = max_skew_s(lease_ttl_s)
        self.off = False  # this clock is further from the storage's than the leases tolerate
        self.skew = timedelta(0)  # how far ahead of the storage's it is
        self._checked = -float("inf")  # monotonic time of the last look (none yet: the next is the first)
        self._task: asyncio.Task[None] | None = None  # a later check, running beside the beats

    async def look(self) -> None:
        """Every CLOCK_CHECK_S, a look at this node's clock: the first before its first heartbeat, the
        next ones beside the beats (on an object store a look takes a second or more), each verdict
        counting from the beat after it."""
        if time.monotonic() - self._checked < CLOCK_CHECK_S:
            return
        first = self._checked == -float("inf")
        self._checked = time.monotonic()
        if first:
            await self._check()
        elif self._task is None or self._task.done():
            self._task = asyncio.create_task(self._check())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _check(self) -> None:
        try:
            measured = await self._probe()
        except OSError as exc:  # the heartbeat's own commit says whether the storage is there
            log.warning("could not compare this node's clock with the table storage's: %s", exc)
            return
        self._metrics.clock_skew.set(measured.seconds)
        self.skew = timedelta(seconds=measured.seconds)
        if measured.high - measured.low > self.max_skew_s:  # too slow a probe to tell: the last verdict stands
            return
        off = measured.beyond(self.max_skew_s)
        if off != self.off:
            if off:
                log.error("this node's clock is %.1f s %s the table storage's, more than the %.1f s the leases "
                          "tolerate (a quarter of LAKEBROKER_INGEST_LEASE_TTL_S): it takes no partitions and "
                          "hands over those it holds until its clock is set right (NTP)", abs(measured.seconds),
                          "ahead of" if measured.seconds > 0 else "behind", self.max_skew_s)
            else:
                log.warning("this node's clock is within %.1f s of the table storage's again (%.1f s): it takes "
                            "partitions again", self.max_skew_s, measured.seconds)
            self._changed()
        self.off = off
        self._metrics.clock_refused.set(1 if off else 0)
