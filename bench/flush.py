"""WAL→Delta flush rate, measured in this process on the flusher's own commit path.

Records are built as the group committer leaves them (offsets dense per partition, keyless,
100-byte text values, three partitions), handed to `Flusher.add`, and committed with
`Flusher.flush_once` (to_thread, txn check, Arrow conversion, delta-rs append with the txn
actions). Beside it, in the same run:
- the floor: a bare delta-rs append of the same rows already in Arrow form (the flush path's
  "bare ASGI"), and
- the flusher's own Arrow conversion alone (`records_to_arrow`),
so the gap between the flusher and what delta-rs can do is split into its Python parts.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from bench.plan import Plan
from ingest_api.flusher import Flusher, records_to_arrow
from ingest_api.metrics import IngestMetrics
from ingest_api.records import Record
from tables import delta
from tables.layout import Layout
from tables.schemas import TOPIC_PARTITION_COLUMNS, TOPIC_SCHEMA, TOPIC_SCHEMA_VERSION
from tables.settings import Settings
from tables.topics import new_topic

PARTITIONS = 3
VALUE = b"v" * 100


@dataclass
class FlushRow:
    records: int
    flush_rows_s: float  # Flusher.flush_once, median of repeats
    flush_ms: float
    to_arrow_rows_s: float  # records_to_arrow alone
    floor_rows_s: float  # bare delta-rs append of the prepared Arrow table

    @property
    def ratio(self) -> float:
        return self.flush_rows_s / self.floor_rows_s if self.floor_rows_s else 0.0


class _Source:
    """Records as the group committer hands them over: dense offsets per partition."""

    def __init__(self, topic: str, topic_id: bytes) -> None:
        self.topic, self.topic_id = topic, topic_id
        self.next = [0] * PARTITIONS
        self.ts = 1_700_000_000_000_000

    def take(self, n: int) -> list[Record]:
        out = []
        for i in range(n):
            p = i % PARTITIONS
            out.append(Record(self.topic, self.topic_id, p, self.next[p], self.ts, None, VALUE, "text", None,
                              None, None, None))
            self.next[p] += 1
        self.ts += 1000
        return out


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


async def _measure(plan: Plan, work: Path) -> list[FlushRow]:
    data = work / "flush-data"
    settings = Settings(data_dir=data)
    topic = new_topic("flushbench", PARTITIONS, max_message_bytes=1 << 20)
    flusher = Flusher(settings, Layout(data), lambda: {topic.name: topic}, IngestMetrics(CollectorRegistry()),
                      lambda: None)
    source = _Source(topic.name, bytes.fromhex(topic.topic_id))
    floor_table = delta.ensure_table(str(data / "floor"), TOPIC_SCHEMA, partition_by=TOPIC_PARTITION_COLUMNS,
                                     version=TOPIC_SCHEMA_VERSION)
    flusher.add(source.take(300))  # creates the table and opens it, outside the timing
    if not await flusher.flush_once():
        raise RuntimeError("flusher could not commit its warm-up batch")
    rows = []
    for n in plan.flush_sizes:
        flush_s, arrow_s, floor_s = [], [], []
        for _ in range(plan.flush_repeats):
            records = source.take(n)
            started = time.perf_counter()
            arrow = records_to_arrow(records)
            arrow_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            floor_table.update_incremental()
            delta.append(floor_table, arrow)
            floor_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            flusher.add(records)
            ok = await flusher.flush_once()
            flush_s.append(time.perf_counter() - started)
            if not ok:
                raise RuntimeError(f"flusher failed to commit a batch of {n}")
        f, a, fl = statistics.median(flush_s), statistics.median(arrow_s), statistics.median(floor_s)
        rows.append(FlushRow(n, _rate(n, f), f * 1e3, _rate(n, a), _rate(n, fl)))
    return rows


def flush_rate(plan: Plan, work: Path) -> list[FlushRow]:
    return asyncio.run(_measure(plan, work))


def server_flush(metrics: dict[str, float]) -> dict[str, float]:
    """The flusher's figures inside a server, from /metrics after a load."""
    rows = metrics.get("lakebroker_flush_batch_records_sum", 0.0)
    commits = metrics.get("lakebroker_flush_batch_records_count", 0.0)
    seconds = metrics.get("lakebroker_flush_latency_seconds_sum", 0.0)
    groups = metrics.get("lakebroker_wal_group_commit_records_count", 0.0)
    grouped = metrics.get("lakebroker_wal_group_commit_records_sum", 0.0)
    return {
        "rows": rows, "commits": commits, "commit_seconds": seconds,
        "rows_per_commit_second": rows / seconds if seconds else 0.0,
        "mean_batch": rows / commits if commits else 0.0,
        "mean_commit_ms": seconds / commits * 1e3 if commits else 0.0,
        "wal_groups": groups, "mean_wal_group": grouped / groups if groups else 0.0,
    }
