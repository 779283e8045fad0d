"""Flusher fairness: a topic with a few records is committed within one bounded round, however
large another topic's backlog, and the bounded rounds still commit every row once, densely."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.chunks import CHUNK_SCHEMA, Chunk, chunk_bytes
from lakebroker.ingest_api.flusher import Flusher
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import Record
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, new_topic
from tests.dir_events import DirEvents

ROUND_ROWS = 1_000  # flush_max_records: the most rows one round commits per topic


def flood_chunks(topic: TopicConfig, per_partition: int, rows: int) -> list[Chunk]:
    """`per_partition` chunks of `rows` messages in each of the topic's partitions, interleaved as the
    group committer hands them over (offsets dense per partition)."""
    topic_id = bytes.fromhex(topic.topic_id)
    columns = pa.Table.from_pylist([{"value": b"v" * 100, "format": "text"}] * rows, schema=CHUNK_SCHEMA)
    return [Chunk(topic.name, topic_id, p, k * rows, 1_700_000_000_000_000, columns, chunk_bytes(columns))
            for k in range(per_partition) for p in range(topic.partitions)]


def probe_record(topic: TopicConfig, offset: int) -> Record:
    return Record(topic.name, bytes.fromhex(topic.topic_id), 0, offset, 1_700_000_000_000_000, None, b"probe",
                  "text", None, None, None, None)


def committed_rows(flusher: Flusher, topic: TopicConfig) -> int:
    topic_id = bytes.fromhex(topic.topic_id)
    return sum(flusher.committed.get((topic_id, p), 0) for p in range(topic.partitions))


def flusher_for(tmp_path: Path, *topics: TopicConfig) -> Flusher:
    flusher = Flusher(Settings(data_dir=tmp_path, flush_max_records=ROUND_ROWS), Layout(tmp_path),
                      lambda: {t.name: t for t in topics}, IngestMetrics(CollectorRegistry()), lambda: None)
    for topic in topics:
        flusher.own(topic)
    return flusher


def test_a_round_takes_the_smaller_topic_first_and_a_bounded_prefix_of_the_flood(tmp_path: Path) -> None:
    flood, probe = new_topic("flood", 3), new_topic("probe", 1)
    flusher = flusher_for(tmp_path, flood, probe)
    chunks = flood_chunks(flood, per_partition=4, rows=250)
    flusher.add(chunks)
    flusher.add([probe_record(probe, 0)])
    taken = flusher._take()
    assert [name for name, _ in taken] == ["probe", "flood"]
    assert taken[1][1] == chunks[:4]  # 1,000 rows: each partition's first chunk, then partition 0's second
    assert flusher._pending == chunks[4:]  # the rest, in order, for the next round
    assert flusher.pending_bytes == sum(c.size for c in chunks[4:])


def test_pending_rows_not_chunks_wake_the_flusher_before_its_interval(tmp_path: Path) -> None:
    flood = new_topic("flood", 2)
    flusher = flusher_for(tmp_path, flood)  # flush_interval_ms 250: only the row count can wake it
    chunks = flood_chunks(flood, per_partition=2, rows=250)  # 4 chunks of 250 rows: 1,000 rows in all
    flusher.add(chunks[:3])
    assert not flusher._wake.is_set()  # 750 rows, under flush_max_records
    flusher.add(chunks[3:])
    assert flusher._wake.is_set()  # 1,000 rows in 4 items: a batch chunk counts its rows
    flusher._wake.clear()
    flusher._take()
    assert flusher._pending == []
    flusher.add([probe_record(flood, 1_000)])
    assert not flusher._wake.is_set()  # what the last round took no longer counts


async def test_a_probe_behind_a_flood_backlog_is_committed_in_the_next_round(tmp_path: Path) -> None:
    flood, probe = new_topic("flood", 3), new_topic("probe", 1)
    flusher = flusher_for(tmp_path, flood, probe)
    flusher.add(flood_chunks(flood, per_partition=4, rows=250))  # 3,000 rows: three rounds' worth
    flusher.add([probe_record(probe, 0)])
    first = flusher.wait_committed((bytes.fromhex(probe.topic_id), 0), 0)

    assert await flusher.flush_round()
    assert first.done()
    assert committed_rows(flusher, flood) == ROUND_ROWS
    assert flusher.pending_bytes > 0

    # A probe record that arrives behind the rest of the backlog waits one round, not the backlog.
    flusher.add([probe_record(probe, 1)])
    second = flusher.wait_committed((bytes.fromhex(probe.topic_id), 0), 1)
    assert await flusher.flush_round()
    assert second.done()
    assert committed_rows(flusher, flood) == 2 * ROUND_ROWS

    assert await flusher.flush_once()  # the rest, in bounded rounds
    assert flusher.pending_bytes == 0
    table = delta.open_table(Layout(tmp_path).topic_table("flood"))
    assert table is not None
    rows = table.to_pyarrow_table()
    for p in range(3):
        offsets = sorted(rows.filter(pa.compute.equal(rows["partition"], p)).column("offset").to_pylist())
        assert offsets == list(range(1000))  # each row once, densely, whatever the rounds
        assert delta.txn_version(table, delta.partition_app_id(p)) == 1000
    flushes = [c for c in table.history() if c.get("lakebroker.operation") == "flush"]
    assert len(flushes) == 3  # one commit per bounded round


async def test_a_commit_that_lands_but_reports_failure_is_not_committed_again(tmp_path: Path,
                                                                               monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The flusher keeps each partition's log-end between its own commits instead of reading the txn
    versions again; a commit that raised (here after it landed, as a failing post-commit step would)
    must drop what it kept, so the retry reads the table and commits no row twice."""
    topic = new_topic("orders", 2)
    flusher = flusher_for(tmp_path, topic)
    flusher.add(flood_chunks(topic, per_partition=1, rows=10))
    assert await flusher.flush_round()  # the log-ends are now kept: 10 and 10

    real_append = delta.append_partitions

    def lands_then_fails(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        real_append(*args, **kwargs)
        raise OSError("the connection dropped after the commit")

    monkeypatch.setattr(delta, "append_partitions", lands_then_fails)
    second = [Chunk(c.topic, c.topic_id, c.partition, 10, c.timestamp_us, c.columns, c.size)
              for c in flood_chunks(topic, per_partition=1, rows=10)]
    flusher.add(second)
    assert not await flusher.flush_round()  # reported failed, kept pending
    monkeypatch.setattr(delta, "append_partitions", real_append)
    assert await flusher.flush_round()  # the retry finds the rows in the table and commits nothing

    table = delta.open_table(Layout(tmp_path).topic_table("orders"))
    assert table is not None
    rows = table.to_pyarrow_table()
    for p in range(2):
        offsets = sorted(rows.filter(pa.compute.equal(rows["partition"], p)).column("offset").to_pylist())
        assert offsets == list(range(20))  # each row once
        assert delta.txn_version(table, delta.partition_app_id(p)) == 20
    assert len([c for c in table.history() if c.get("lakebroker.operation") == "flush"]) == 2


async def test_the_backlog_counts_what_a_commit_in_progress_holds(tmp_path: Path,
                                                                    monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`lakebroker_wal_backlog_bytes` (pending_bytes) is what is not in the table yet: the items a
    round has taken count until their commit returns, and a failed commit's stay in it."""
    topic = new_topic("orders", 2)
    flusher = flusher_for(tmp_path, topic)
    chunks = flood_chunks(topic, per_partition=1, rows=10)
    flusher.add(chunks)
    seen: list[int] = []
    real_append = delta.append_partitions

    def observed(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        seen.append(flusher.pending_bytes)  # in the commit's thread, before it lands
        real_append(*args, **kwargs)

    monkeypatch.setattr(delta, "append_partitions", observed)
    assert await flusher.flush_round()
    assert seen == [sum(c.size for c in chunks)]
    assert flusher.pending_bytes == 0

    def fails(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        raise OSError("storage unreachable")

    monkeypatch.setattr(delta, "append_partitions", fails)
    second = [Chunk(c.topic, c.topic_id, c.partition, 10, c.timestamp_us, c.columns, c.size) for c in chunks]
    flusher.add(second)
    assert not await flusher.flush_round()
    assert flusher.pending_bytes == sum(c.size for c in second)


async def test_a_topic_table_checkpoints_every_10_commits(tmp_path: Path) -> None:
    """TOPIC_TABLE_PROPERTIES: delta-rs replays the log from the last checkpoint to write the next
    one, a blocking thread per commit file, so a busy topic's table checkpoints at Delta's own
    default interval rather than delta-rs's 100; the log cleanup stays at one per 100 commits.

    Each checkpoint and `_last_checkpoint` arrive whole: object_store's local put writes a staging
    file (`name#n`) and renames it into place, so a reader (or Spark) never opens a torn one. On S3
    a PUT is visible only once complete (tests/spark_pipeline/test_s3.py)."""
    probe = new_topic("probe", 1)
    flusher = flusher_for(tmp_path, probe)
    uri = Layout(tmp_path).topic_table("probe")
    log = Path(uri) / "_delta_log"
    flusher.add([probe_record(probe, 0)])
    assert await flusher.flush_once()  # creates the table: versions 0-2, before any checkpoint
    events = DirEvents(log)
    offset = 1
    try:
        while (table := delta.open_table(uri)) is None or table.version() < 19:
            flusher.add([probe_record(probe, offset)])
            assert await flusher.flush_once()
            offset += 1
    finally:
        events.drain()
        events.close()
    assert table.metadata().configuration["delta.checkpointInterval"] == "10"
    assert sorted(int(p.name[:20]) for p in log.glob("*.checkpoint.parquet")) == [9, 19]
    checkpoints = [f"{v:020d}.checkpoint.parquet" for v in (9, 19)]
    assert [n for n in events.renamed_in if n.endswith(".checkpoint.parquet")] == checkpoints
    assert events.renamed_in.count("_last_checkpoint") == 2
    in_place = set(events.created + events.written) & {*checkpoints, "_last_checkpoint"}
    assert not in_place, f"written in place (visible half-written): {in_place}"
    assert not delta.commit_hooks(table).cleanup_expired_logs  # version 20 writes no checkpoint
    assert sorted(table.to_pyarrow_table().column("offset").to_pylist()) == list(range(offset))
