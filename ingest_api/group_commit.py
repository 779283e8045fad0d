"""Group commit: many produce requests share one WAL write and one fsync.

Requests queue `Pending` messages, or a columnar batch's `PendingChunk`s (one per partition).
One writer task takes everything queued, assigns each message its offset and timestamp (a
chunk a dense run of offsets from its first), writes the group and fsyncs it in a thread, then answers
every request in the group. Offsets are assigned here, by the only task that assigns them,
so a group that fails to become durable (disk full) is rolled back without leaving a gap.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ingest_api.chunks import Chunk, encode_chunk
from ingest_api.dedup import Placed
from ingest_api.metrics import IngestMetrics
from ingest_api.records import Record, encode
from ingest_api.wal import PartitionKey, Wal
from tables.errors import StorageUnavailable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Pending:
    record: Record  # offset and timestamp are filled in by the writer
    future: asyncio.Future[Placed] | None = field(default=None)


@dataclass(slots=True)
class PendingChunk:
    chunk: Chunk  # offset and timestamp are filled in by the writer
    future: asyncio.Future[Chunk] | None = field(default=None)


Queued = Pending | PendingChunk


class GroupCommitter:
    def __init__(
        self,
        wal: Wal,
        next_offsets: dict[PartitionKey, int],
        on_durable: Callable[[list[Record | Chunk]], None],
        metrics: IngestMetrics,
        max_group: int = 65536,
    ) -> None:
        self._wal = wal
        self.next_offsets = next_offsets
        self._on_durable = on_durable
        self._metrics = metrics
        self._max_group = max_group
        self._queue: list[Queued] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._last_ts = 0
        self.queued_bytes = 0

    def submit(self, items: list[Pending] | list[PendingChunk]) -> None:
        self._queue.extend(items)
        self.queued_bytes += sum(p.record.size if isinstance(p, Pending) else p.chunk.size for p in items)
        self._wake.set()

    def submit_one(self, item: Pending) -> None:
        self._queue.append(item)
        self.queued_bytes += item.record.size
        self._wake.set()

    def _take(self) -> list[Queued]:
        """The next group: queued items in order up to max_group messages (at least one item).
        Single messages queued behind that bound join it, up to max_group of them, so a one-message
        request waits for one group, not for every batch queued before it. They only move ahead of
        other requests' chunks: each request's messages keep their order, so offsets stay in it."""
        rows, n = 0, 0
        for p in self._queue:
            if rows >= self._max_group:
                break
            rows += 1 if isinstance(p, Pending) else p.chunk.rows
            n += 1
        group, rest = self._queue[:n], self._queue[n:]
        if rest:
            later: list[Queued] = []
            singles = 0
            for p in rest:
                if isinstance(p, Pending) and singles < self._max_group:
                    group.append(p)
                    singles += 1
                else:
                    later.append(p)
            rest = later
        self._queue = rest
        return group

    async def run(self) -> None:
        """Commit groups until close(); returns between groups, never in the middle of one."""
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and not self._closing:
                await self._commit(self._take())

    def close(self) -> None:
        self._closing = True
        self._wake.set()

    async def drain(self) -> None:
        """Commit whatever is queued now: at shutdown once run() has returned, or with no run() (the CLI)."""
        while self._queue:
            await self._commit(self._take())

    async def _commit(self, group: list[Queued]) -> None:
        records = [p.record if isinstance(p, Pending) else p.chunk for p in group]
        saved = self._assign(records)
        # A single message's frame is encoded here, on the loop: a few µs each, and the thread then
        # needs the GIL for no Python work. A chunk's (Arrow IPC) is written in the thread.
        frames = [encode(r) if isinstance(r, Record) else r for r in records]
        try:
            await asyncio.to_thread(self._write, frames, records)
        except Exception as exc:  # noqa: BLE001 - any failure means: not durable, roll back
            self.next_offsets.update(saved)
            reason = "disk full" if isinstance(exc, OSError) and exc.errno == errno.ENOSPC else f"write failed ({exc})"
            log.error("WAL group of %d not durable: %s", len(group), reason)
            error = StorageUnavailable(f"WAL {reason}: the message was not accepted; retry once space returns")
            for p in group:
                if p.future is not None and not p.future.done():
                    p.future.set_exception(error)
            self.queued_bytes -= sum(r.size for r in records)
            return
        self.queued_bytes -= sum(r.size for r in records)
        self._metrics.wal_group_size.observe(sum(1 if isinstance(r, Record) else r.rows for r in records))
        for p in group:
            if isinstance(p, Pending):
                if p.future is not None and not p.future.done():
                    p.future.set_result((p.record.partition, p.record.offset, p.record.timestamp_us))
            elif p.future is not None and not p.future.done():
                p.future.set_result(p.chunk)
        self._on_durable(records)

    def _assign(self, records: list[Record | Chunk]) -> dict[PartitionKey, int]:
        # Log-append time, never going backwards, so seeking by time is monotonic per partition.
        now = max(time.time_ns() // 1000, self._last_ts)
        self._last_ts = now
        saved: dict[PartitionKey, int] = {}
        offsets = self.next_offsets
        for r in records:
            key = (r.topic_id, r.partition)
            nxt = offsets.get(key, 0)
            if key not in saved:
                saved[key] = nxt
            r.offset = nxt
            r.timestamp_us = now
            offsets[key] = nxt + (1 if isinstance(r, Record) else r.rows)
        return saved

    def _write(self, frames: list[bytes | Chunk], records: list[Record | Chunk]) -> None:
        """`frames`: each record's frame, or a chunk still to encode (here, in the thread)."""
        self._wal.append([f if isinstance(f, bytes) else encode_chunk(f) for f in frames], records)
