"""Spark jobs on a real S3 server (MinIO): put-if-absent commits from both writers, compaction
racing the flusher, retention, key compaction, replication to a bucket and back, and a failover
onto a bucket replica."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lakebroker.ingest_api import create_app
from lakebroker.spark_pipeline.jobs import (
    compaction,
    key_compaction,
    offsets_compaction,
    replication,
    retention,
    verify_replica,
)
from lakebroker.spark_pipeline.results import Outcome
from lakebroker.tables import delta
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import OffsetReason, OffsetsTable
from tests.s3 import S3Server
from tests.spark_pipeline.topics import (
    NOW_US,
    ConcurrentFlusher,
    commit_infos,
    create_topic,
    log_ends,
    offsets_by_partition,
    produce,
    rows,
    settings_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]
HOUR_US = 3_600_000_000


def test_spark_commits_to_s3_are_put_if_absent(s3_spark: Any, s3_root: str) -> None:
    """The LogStore Spark uses for s3a:// refuses a version that exists, as delta-rs's commit does."""
    jvm = s3_spark._jvm
    conf = s3_spark._jsc.hadoopConfiguration()
    assert s3_spark.conf.get("spark.delta.logStore.s3a.impl") == "io.lakebroker.delta.S3ConditionalLogStore"
    store = jvm.io.lakebroker.delta.S3ConditionalLogStore(conf)
    path = jvm.org.apache.hadoop.fs.Path(f"{s3_root.replace('s3://', 's3a://')}/t/_delta_log/{0:020d}.json")
    store.write(path, jvm.java.util.ArrayList(['{"first":1}']).iterator(), False, conf)
    with pytest.raises(Exception, match="FileAlreadyExistsException"):
        store.write(path, jvm.java.util.ArrayList(['{"second":1}']).iterator(), False, conf)
    assert list(store.read(path, conf)) == ['{"first":1}']  # the first writer's commit survives


def test_compaction_on_s3_racing_the_flusher_loses_no_row_or_commit(s3_spark: Any, s3_root: str,
                                                                    tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data", tables_uri=s3_root, compaction_target_file_bytes=40_000)
    create_topic(settings, "orders", partitions=2)
    for i in range(12):
        produce(settings, "orders", i % 2, 40)

    with ConcurrentFlusher(settings, "orders", 25) as flusher:
        flusher.wait_for_commits(1)
        result = compaction.run(s3_spark, settings, "orders")
    appended = flusher.appended
    assert not flusher.errors, flusher.errors
    assert result.outcome is Outcome.OK, result.public()
    assert len(appended) >= 3, "the writer must really have run during compaction"

    ends = log_ends(settings, "orders", 2)
    offsets = offsets_by_partition(settings, "orders")
    for p in (0, 1):
        assert offsets[p] == list(range(ends[p] or 0)), f"partition {p}"  # dense: nothing lost or doubled
        assert ends[p] == max(end for q, _, end, _ in appended if q == p)
    infos = commit_infos(Layout.of(settings).topic_table("orders"))
    versions = [v for v, _ in infos]
    assert versions == list(range(versions[0], versions[-1] + 1))
    assert len([c for _, c in infos if c.get("lakebroker.operation") == "flush"]) == 12 + len(appended)
    optimizes = [(v, c) for v, c in infos if c["operation"] == "OPTIMIZE"]
    assert optimizes, "compaction committed"
    assert any(c["readVersion"] < v - 1 for v, c in optimizes), optimizes  # it committed past flusher commits
    assert result.table("orders").details["files_rewritten"] > result.table("orders").details["bins"]

    # Replication from this bucket to another prefix, then verify that replica.
    replica = s3_root + "-replica"
    copied = replication.run(s3_spark, settings, "orders", to=replica)
    assert copied.outcome is Outcome.OK, copied.public()
    assert copied.table("orders").details["rows_copied"] == sum(ends[p] or 0 for p in (0, 1))
    check = verify_replica.verify(s3_spark, settings, replica, topic="orders")
    assert check.ok and check.lag_messages == 0, check.problems


def test_retention_key_compaction_and_offsets_compaction_on_s3(s3_spark: Any, s3_root: str, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data", tables_uri=s3_root, key_compaction_min_lag_ms=0)
    create_topic(settings, "events", partitions=1, retention_ms=3_600_000)
    old = NOW_US() - 2 * HOUR_US
    produce(settings, "events", 0, 10, ts_us=old)  # 0-9 expired
    produce(settings, "events", 0, 5)  # 10-14 fresh
    create_topic(settings, "users", partitions=1, cleanup_policy="compact", tombstone_retention_ms=3_600_000)
    produce(settings, "users", 0, 4, ts_us=old, keys=["a", "b", "a", "b"], values=[b"a0", b"b1", b"a2", b"b3"])

    kept = retention.run(s3_spark, settings, "events")
    assert kept.outcome is Outcome.OK, kept.public()
    assert offsets_by_partition(settings, "events") == {0: list(range(10, 15))}
    assert log_ends(settings, "events", 1) == {0: 15}

    compacted = key_compaction.run(s3_spark, settings, "users")
    assert compacted.outcome is Outcome.OK, compacted.public()
    assert {(r["offset"], r["value"]) for r in rows(settings, "users", ["offset", "value"])} == {(2, b"a2"), (3, b"b3")}

    offsets = OffsetsTable(Layout.of(settings))  # _system/consumer_offsets, in the bucket too
    for n in range(1, 4):
        offsets.commit("g1", "events", {0: 10 + n}, OffsetReason.ACK)
    before = offsets.latest()
    squeezed = offsets_compaction.run(s3_spark, settings)
    assert squeezed.outcome is Outcome.OK, squeezed.public()
    assert squeezed.table("_system/consumer_offsets").rows_removed == 2
    assert OffsetsTable(Layout.of(settings)).latest() == before


def test_replicate_local_to_a_bucket_then_fail_over_onto_it(s3_spark: Any, s3_server: S3Server,
                                                            tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    create_topic(settings, "orders", partitions=2)
    for i in range(4):
        produce(settings, "orders", i % 2, 10)
    replica = s3_server.uri("replica")

    first = replication.run(s3_spark, settings, to=replica)
    assert first.outcome is Outcome.OK, first.public()
    assert first.table("orders").details["rows_copied"] == 40
    produce(settings, "orders", 1, 7)  # incremental: the next run copies only these
    second = replication.run(s3_spark, settings, to=replica)
    assert second.table("orders").details["rows_copied"] == 7
    check = verify_replica.verify(s3_spark, settings, replica)
    assert check.ok and check.lag_messages == 0, check.problems

    # The failover steps of docs/operations.md with the bucket replica: step 3's invariant (each
    # partition's txn log end is one past its highest offset), then serve with the tables on it.
    promoted = settings_for(tmp_path / "new-primary", tables_uri=replica, deliver_in_serve=False)
    table = delta.load(Layout.of(promoted).topic_table("orders"))
    copied = offsets_by_partition(promoted, "orders")
    for p in (0, 1):
        assert table.transaction_version(delta.partition_app_id(p)) == max(copied[p]) + 1
    with TestClient(create_app(promoted)) as client:
        assert [t["name"] for t in client.get("/v1/topics").json()] == ["orders"]
        r = client.post("/v1/topics/orders/messages?ack=table", json={"value": "after failover", "partition": 1})
        assert r.status_code == 200, r.text
        assert r.json()["offset"] == 27  # offsets go on from the replica's log end, never reused
        body = client.get("/v1/topics/orders/partitions/1/messages", params={"offset": 0, "limit": 100}).json()
        assert [m["offset"] for m in body["messages"]] == list(range(28))
    for a, b in itertools.pairwise(sorted(copied[0])):
        assert b == a + 1


def test_bucket_replica_uris_are_s3a_and_outside_the_table_root(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert replication.resolve_replica("s3://bucket/replica/", data).root == "s3a://bucket/replica"
    assert replication.resolve_replica("s3://bucket/mainx", data, "s3://bucket/main").root == "s3a://bucket/mainx"
    for inside in ("s3://bucket/main", "s3a://bucket/main/replica", "s3://bucket"):
        with pytest.raises(InvalidRequest, match="outside the table root"):
            replication.resolve_replica(inside, data, "s3://bucket/main")
    with pytest.raises(InvalidRequest):
        replication.resolve_replica("s3://key:secret@bucket/replica", data)
