"""The broker: one object that owns a data dir's WAL, offsets, dedup index and flusher.

Data flows one way: `produce` validates and partitions → GroupCommitter (WAL, fsync,
offsets) → Flusher (Delta) → WAL segments released. The HTTP routes and the embedded CLI
both drive this class; it knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from enum import StrEnum

import pyarrow.compute as pc

from ingest_api.dedup import DedupIndex, DedupKey, Placed, dedup_id
from ingest_api.flusher import Flusher
from ingest_api.group_commit import GroupCommitter, Pending
from ingest_api.metrics import IngestMetrics
from ingest_api.partitioner import RoundRobin, partition_for_key
from ingest_api.records import Record, message_bytes
from ingest_api.wal import PartitionKey, Wal
from tables import delta
from tables.errors import Backpressure, InvalidRequest, LakebrokerError, NotFound, TooLarge
from tables.layout import Layout
from tables.settings import Settings
from tables.topics import TopicConfig, TopicStore

log = logging.getLogger(__name__)
_NEVER = 2**63


class AckMode(StrEnum):
    NONE = "none"  # answered when queued; lost if the process dies before the fsync
    WAL = "wal"  # answered after the WAL fsync (the default)
    TABLE = "table"  # answered after the Delta commit


@dataclass(slots=True)
class NewMessage:
    value: bytes | None
    format: str = "text"
    key: str | None = None
    headers: dict[str, str] | None = None
    partition: int | None = None
    message_id: str | None = None
    producer_id: str | None = None
    sequence: int | None = None


@dataclass(slots=True)
class ProduceResult:
    partition: int
    offset: int | None
    duplicate: bool = False
    timestamp_us: int | None = None  # log-append time; None while the offset is


class Broker:
    def __init__(self, settings: Settings, metrics: IngestMetrics) -> None:
        self.settings = settings
        self.layout = Layout.of(settings)
        self.metrics = metrics
        self.store = TopicStore(self.layout)
        self.topics: dict[str, TopicConfig] = {}
        self.dedup = DedupIndex(window_s=settings.dedup_window_s, max_entries=settings.dedup_max_entries)
        self._round_robin: dict[str, RoundRobin] = {}
        self.wal = Wal(self.layout.wal_dir, segment_bytes=settings.wal_segment_bytes, fsync=settings.wal_fsync)
        self.flusher = Flusher(settings, self.layout, lambda: self.topics, metrics, self._release_wal)
        self.committer = GroupCommitter(self.wal, {}, self._durable, metrics)
        self._tasks: list[asyncio.Task[None]] = []
        self.started = False

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self.layout.data_dir.mkdir(parents=True, exist_ok=True)
        self.topics = await asyncio.to_thread(self.store.load)
        committed = await asyncio.to_thread(self._read_committed_ends)
        report = await asyncio.to_thread(self.wal.recover)
        for span in report.corrupt:
            self.metrics.wal_corrupt.inc()
            log.error("WAL corruption in %s bytes %d-%d was skipped", span.segment, span.start, span.end)
        live = {bytes.fromhex(t.topic_id): t for t in self.topics.values()}
        next_offsets = dict(committed)
        unflushed: list[Record] = []
        for r in report.records:
            key = (r.topic_id, r.partition)
            if r.topic_id not in live:
                continue
            next_offsets[key] = max(next_offsets.get(key, 0), r.offset + 1)
            if r.offset >= committed.get(key, 0):
                unflushed.append(r)
        self.committer.next_offsets = next_offsets
        self.flusher.committed = dict(committed)
        await asyncio.to_thread(self._rebuild_dedup, report.records)
        log.info("recovered: %d WAL records, %d not yet in Delta, %d torn bytes", len(report.records),
                 len(unflushed), report.torn_bytes)
        self.flusher.add(unflushed)
        if unflushed:
            await self.flusher.flush_once()
        self._release_wal()
        self._tasks = [asyncio.create_task(self.committer.run()), asyncio.create_task(self.flusher.run())]
        self.started = True

    async def stop(self) -> None:
        # The tasks stop first, each between two groups or flushes, so the drain below is the
        # only writer: a drain beside a running committer or flusher could interleave with it.
        self.committer.close()
        self.flusher.close()
        for task in self._tasks:
            await task
        await self.committer.drain()
        if self.flusher.pending_bytes:
            await self.flusher.flush_once()
        self.wal.close()
        self.started = False

    def _read_committed_ends(self) -> dict[PartitionKey, int]:
        ends: dict[PartitionKey, int] = {}
        for topic in self.topics.values():
            table = delta.open_table(self.layout.topic_table(topic.name))
            for p in range(topic.partitions):
                end = 0 if table is None else delta.txn_version(table, delta.partition_app_id(p)) or 0
                ends[(bytes.fromhex(topic.topic_id), p)] = end
        return ends

    def _rebuild_dedup(self, wal_records: list[Record]) -> None:
        horizon_us = int((time.time() - self.settings.dedup_window_s) * 1_000_000)
        seen: list[tuple[int, DedupKey, int, int]] = []
        for topic in self.topics.values():
            table = delta.open_table(self.layout.topic_table(topic.name))
            if table is None:
                continue
            rows = delta.read_rows(
                table,
                (pc.field("timestamp") >= delta.timestamp_literal(horizon_us))
                & (pc.field("message_id").is_valid() | pc.field("producer_id").is_valid()),
                columns=["partition", "offset", "timestamp", "message_id", "producer_id", "sequence"],
            )
            for row in rows.to_pylist():
                did = dedup_id(row["message_id"], row["producer_id"], row["sequence"])
                if did is not None:
                    ts = int(row["timestamp"].timestamp() * 1_000_000)
                    seen.append((ts, (topic.topic_id, did), row["partition"], row["offset"]))
        live = {bytes.fromhex(t.topic_id) for t in self.topics.values()}
        for r in wal_records:
            did = dedup_id(r.message_id, r.producer_id, r.sequence)
            if did is not None and r.timestamp_us >= horizon_us and r.topic_id in live:
                seen.append((r.timestamp_us, (r.topic_id.hex(), did), r.partition, r.offset))
        for ts, key, partition, offset in sorted(seen):
            self.dedup.remember(key, (partition, offset, ts))

    # -- topics -------------------------------------------------------------------------
    def topic(self, name: str) -> TopicConfig:
        topic = self.topics.get(name)
        if topic is None:
            self.store.get(name)  # raises a precise InvalidName or NotFound
            raise NotFound(f"topic {name!r} does not exist")
        return topic

    async def create_topic(self, topic: TopicConfig) -> TopicConfig:
        created = await asyncio.to_thread(self.store.create, topic)
        self.topics = {**self.topics, created.name: created}
        return created

    async def update_topic(self, name: str, **changes: object) -> TopicConfig:
        self.topic(name)
        updated = await asyncio.to_thread(self.store.update, name, **changes)
        self.topics = {**self.topics, name: updated}
        return updated

    async def delete_topic(self, name: str) -> None:
        topic = self.topic(name)
        async with self.flusher.commit_lock:  # no flush may land in the table once it is gone
            await asyncio.to_thread(self.store.delete, name)
            self.topics = {k: v for k, v in self.topics.items() if k != name}
        self._round_robin.pop(name, None)
        await self.flusher.forget(topic.topic_id)

    def log_end(self, topic: TopicConfig, partition: int) -> int:
        return self.committer.next_offsets.get((bytes.fromhex(topic.topic_id), partition), 0)

    def committed_end(self, topic: TopicConfig, partition: int) -> int:
        return self.flusher.committed.get((bytes.fromhex(topic.topic_id), partition), 0)

    # -- produce ------------------------------------------------------------------------
    @property
    def backlog_bytes(self) -> int:
        return self.committer.queued_bytes + self.flusher.pending_bytes

    async def produce(self, topic_name: str, messages: list[NewMessage], ack: AckMode) -> list[ProduceResult]:
        topic = self.topic(topic_name)
        try:
            self._validate(topic, messages)
        except LakebrokerError as exc:
            self.metrics.rejected_for(exc.code).inc()
            raise
        if self.backlog_bytes > self.settings.max_backlog_bytes:
            self.metrics.rejected_for("backpressure").inc()
            raise Backpressure(
                f"{self.backlog_bytes} bytes wait to be committed to Delta (limit "
                f"{self.settings.max_backlog_bytes}); retry after the indicated delay",
                retry_after_s=1.0,
            )
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        topic_id = bytes.fromhex(topic.topic_id)
        results: list[ProduceResult | None] = [None] * len(messages)
        waits: list[tuple[int, asyncio.Future[Placed], bool]] = []
        pending: list[Pending] = []
        for i, m in enumerate(messages):
            did = dedup_id(m.message_id, m.producer_id, m.sequence)
            key: DedupKey | None = None if did is None else (topic.topic_id, did)
            if key is not None:
                hit = self.dedup.lookup(key)
                if isinstance(hit, tuple):
                    results[i] = ProduceResult(hit[0], hit[1], True, hit[2])
                    continue
                if hit is not None:
                    waits.append((i, hit, True))
                    continue
            partition = self._partition(topic, m)
            record = Record(topic.name, topic_id, partition, -1, 0, m.key, m.value, m.format, m.headers,
                            m.message_id, m.producer_id, m.sequence)
            future: asyncio.Future[Placed] | None = None
            if ack is not AckMode.NONE or key is not None:
                future = loop.create_future()
                waits.append((i, future, False))
            if key is not None and future is not None:
                self.dedup.begin(key, future)
                future.add_done_callback(self._dedup_callback(key))
            pending.append(Pending(record, future))
            results[i] = ProduceResult(partition, None)
        if pending:
            self.committer.submit(pending)
        self.metrics.produced_to(topic.name, ack.value).inc(len(pending))
        if ack is AckMode.NONE:
            for i, future, dup in waits:
                if dup and future.done() and not future.exception():
                    p, o, ts = future.result()
                    results[i] = ProduceResult(p, o, True, ts)
                elif dup:
                    results[i] = ProduceResult(-1, None, duplicate=True)
            return [r for r in results if r is not None]
        await asyncio.gather(*(f for _, f, _ in waits), return_exceptions=True)
        for i, future, dup in waits:
            p, o, ts = future.result()  # re-raises StorageUnavailable for a group that failed
            results[i] = ProduceResult(p, o, dup, ts)
        if duplicates := sum(1 for r in results if r is not None and r.duplicate):
            self.metrics.duplicates_to(topic.name).inc(duplicates)
        if ack is AckMode.TABLE:
            highest: dict[int, int] = {}
            for r in results:
                assert r is not None and r.offset is not None
                highest[r.partition] = max(highest.get(r.partition, -1), r.offset)
            await asyncio.gather(*(self.flusher.wait_committed((topic_id, p), o) for p, o in highest.items()))
        self.metrics.produce_latency_of(ack.value).observe(time.perf_counter() - started)
        return [r for r in results if r is not None]

    def _validate(self, topic: TopicConfig, messages: list[NewMessage]) -> None:
        if not messages:
            raise InvalidRequest("no messages to produce")
        for i, m in enumerate(messages):
            size = message_bytes(m.key, m.value, m.headers)
            if size > topic.max_message_bytes:
                raise TooLarge(
                    f"message {i} is {size} bytes (key, value and headers), over topic {topic.name!r}'s "
                    f"max_message_bytes {topic.max_message_bytes}"
                )
            if m.partition is not None:
                topic.check_partition(m.partition)
            if (m.producer_id is None) != (m.sequence is None) and m.message_id is None:
                raise InvalidRequest(f"message {i}: producer_id and sequence must be given together")

    def _partition(self, topic: TopicConfig, m: NewMessage) -> int:
        if m.partition is not None:
            return m.partition
        if m.key is not None:
            return partition_for_key(m.key, topic.partitions)
        rr = self._round_robin.get(topic.name)
        if rr is None:
            rr = self._round_robin[topic.name] = RoundRobin()
        return rr.next(topic.partitions)

    def _dedup_callback(self, key: DedupKey):  # type: ignore[no-untyped-def]
        def done(future: asyncio.Future[Placed]) -> None:
            if future.cancelled() or future.exception() is not None:
                self.dedup.abandon(key)
            else:
                self.dedup.remember(key, future.result())

        return done

    # -- pipeline callbacks -------------------------------------------------------------
    def _durable(self, records: list[Record]) -> None:
        self.flusher.add(records)

    def _release_wal(self) -> None:
        live = {bytes.fromhex(t.topic_id) for t in self.topics.values()}
        committed = self.flusher.committed

        def committed_below(key: PartitionKey) -> int:
            return committed.get(key, 0) if key[0] in live else _NEVER

        self.wal.release(committed_below)
        self.metrics.wal_segments.set(self.wal.segment_count())
        self.metrics.wal_backlog_bytes.set(self.backlog_bytes)
