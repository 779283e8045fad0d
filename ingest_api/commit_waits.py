"""Waits for a partition's committed end to pass an offset: how `ack=table` learns its message
is in the Delta table (acks.py), settled by the flusher as its commits land."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable

from lakebroker.ingest_api.wal import PartitionKey


class CommitWaits:
    def __init__(self) -> None:
        self._waits: dict[PartitionKey, list[tuple[int, asyncio.Future[None]]]] = defaultdict(list)

    def add(self, key: PartitionKey, offset: int) -> asyncio.Future[None]:
        """A wait its caller may cancel (a Kafka Fetch's long poll that timed out): cancelled waits
        are dropped here once they outnumber the live ones, so an idle partition's list stays short."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waits = self._waits[key]
        waits.append((offset, future))
        if len(waits) >= 64 and len(waits) & (len(waits) - 1) == 0:  # at each power of two: amortized O(1)
            self._waits[key] = [(o, f) for o, f in waits if not f.done()]
        return future

    def committed(self, key: PartitionKey, end: int) -> None:
        """The partition's committed end is `end`: the waits for offsets below it are over."""
        waits = self._waits.get(key)
        if waits:
            for offset, future in waits:
                if offset < end and not future.done():
                    future.set_result(None)
            self._waits[key] = [(o, f) for o, f in waits if o >= end]

    def fail(self, key: PartitionKey, error: Callable[[], Exception]) -> None:
        """Each wait of the partition fails with an error of its own (a raised error keeps its traceback)."""
        for _, future in self._waits.pop(key, []):
            if not future.done():
                future.set_exception(error())

    def fail_topic(self, topic_id: bytes, error: Callable[[], Exception]) -> None:
        for key in [k for k in self._waits if k[0] == topic_id]:
            self.fail(key, error)
