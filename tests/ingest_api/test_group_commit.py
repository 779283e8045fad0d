"""Group commit fairness: a single message queued behind many batches is written in the next
group, not after all of them, and every message still gets a dense offset in request order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
from prometheus_client import CollectorRegistry

from ingest_api.chunks import CHUNK_SCHEMA, Chunk, chunk_bytes
from ingest_api.group_commit import GroupCommitter, Pending, PendingChunk
from ingest_api.metrics import IngestMetrics
from ingest_api.records import Record
from ingest_api.wal import Wal

TOPIC_ID = bytes(range(16))
GROUP = 1_000  # max_group: messages per WAL group


def batch(rows: int) -> PendingChunk:
    columns = pa.Table.from_pylist([{"value": b"v" * 100, "format": "text"}] * rows, schema=CHUNK_SCHEMA)
    return PendingChunk(Chunk("t", TOPIC_ID, 0, -1, 0, columns, chunk_bytes(columns)))


def single(value: bytes) -> Pending:
    return Pending(Record("t", TOPIC_ID, 0, -1, 0, None, value, "text", None, None, None, None))


async def test_a_single_message_behind_a_batch_backlog_joins_the_next_group(tmp_path: Path) -> None:
    wal = Wal(tmp_path / "wal", segment_bytes=1 << 24, fsync=True)
    wal.recover()
    groups: list[list[Record | Chunk]] = []
    committer = GroupCommitter(wal, {}, groups.append, IngestMetrics(CollectorRegistry()), max_group=GROUP)
    batches = [batch(GROUP) for _ in range(5)]  # five groups' worth of batches, queued first
    committer.submit(batches)
    a, b = single(b"a"), single(b"b")
    a.future, b.future = asyncio.get_running_loop().create_future(), asyncio.get_running_loop().create_future()
    committer.submit([a, b])
    await committer.drain()
    wal.close()

    assert groups[0] == [batches[0].chunk, a.record, b.record]  # not behind the other four batches
    assert [g[0] for g in groups[1:]] == [p.chunk for p in batches[1:]]
    assert a.future.result()[:2] == (0, GROUP) and b.future.result()[:2] == (0, GROUP + 1)
    # Offsets stay dense in the order the groups were written: the batches after the singles go on from them.
    assert [p.chunk.offset for p in batches] == [0, GROUP + 2, 2 * GROUP + 2, 3 * GROUP + 2, 4 * GROUP + 2]
    assert committer.queued_bytes == 0
