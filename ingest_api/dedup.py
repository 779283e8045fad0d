"""The idempotent-producer index: (topic id, message id) → the original partition, offset and timestamp.

An id is a producer-supplied message id, or a producer id with a sequence number. The index
is bounded by a time window and an entry count, and is rebuilt at start from the WAL and the
Delta table, so a retry after a restart still gets the original answer.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

DedupKey = tuple[str, str]  # (topic id, not name: a re-created topic is a new log; dedup id)
Placed = tuple[int, int, int]  # where a message went: partition, offset, log-append time (epoch µs)


def dedup_id(message_id: str | None, producer_id: str | None, sequence: int | None) -> str | None:
    if message_id is not None:
        return "m:" + message_id
    if producer_id is not None and sequence is not None:
        return f"p:{producer_id}:{sequence}"
    return None


class DedupIndex:
    def __init__(self, *, window_s: float, max_entries: int) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._done: OrderedDict[DedupKey, Placed] = OrderedDict()
        self._inflight: dict[DedupKey, asyncio.Future[Placed]] = {}

    def __len__(self) -> int:
        return len(self._done)

    def lookup(self, key: DedupKey) -> Placed | asyncio.Future[Placed] | None:
        hit = self._done.get(key)
        if hit is not None:
            return hit
        return self._inflight.get(key)

    def begin(self, key: DedupKey, future: asyncio.Future[Placed]) -> None:
        self._inflight[key] = future

    def abandon(self, key: DedupKey) -> None:
        """The send failed before it was durable: a retry must be accepted afresh."""
        self._inflight.pop(key, None)

    def remember(self, key: DedupKey, placed: Placed) -> None:
        """`placed`'s log-append time also dates the entry for the window."""
        self._inflight.pop(key, None)
        self._done[key] = placed
        self._done.move_to_end(key)
        self._evict()

    def _evict(self) -> None:
        horizon_us = (time.time() - self.window_s) * 1_000_000
        while self._done:
            key, (_, _, at_us) = next(iter(self._done.items()))
            if at_us >= horizon_us and len(self._done) <= self.max_entries:
                break
            del self._done[key]
