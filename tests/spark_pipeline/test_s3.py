"""Spark jobs on a real S3 server (MinIO): put-if-absent commits from both writers, checkpoints
from both seen only whole by a concurrent reader, compaction racing the flusher, retention, key
compaction, replication to a bucket and back, and a failover onto a bucket replica."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from lakebroker.server import build_app
from lakebroker.spark_pipeline.jobs import (
    compaction,
    key_compaction,
    offsets_compaction,
    replication,
    retention,
    verify_replica,
)
from lakebroker.tables import delta, storage
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.job_runs import Outcome
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
from tests.waiting import eventually

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
    with TestClient(build_app(promoted)) as client:
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


class _LogWatch:
    """A thread that lists a table's `_delta_log` on S3 over and over (bounded in count and time),
    and opens each checkpoint the moment a listing first shows it: `first_sizes` holds the size it
    was listed with, `errors` any checkpoint or `_last_checkpoint` that did not read whole."""

    def __init__(self, uri: str) -> None:
        fs, root = storage.filesystem(uri)
        assert isinstance(fs, pafs.FileSystem)
        self._fs, self._log = fs, f"{root}/_delta_log"
        self.first_sizes: dict[str, int] = {}
        self.last_checkpoint_reads = 0
        self.passes = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="s3-log-lister")

    def listing(self) -> dict[str, int]:
        return {f.base_name: f.size for f in self._fs.get_file_info(pafs.FileSelector(self._log))}

    def _get(self, name: str) -> bytes:
        """One GET of a whole object, as delta-rs reads `_last_checkpoint`. (pyarrow reads a HEAD
        for the size, then a ranged GET: across an overwrite that mixes two versions.)"""
        s3 = storage.S3Endpoint.from_env()
        got = subprocess.run(["curl", "-fsS", "--aws-sigv4", f"aws:amz:{s3.region}:s3", "-K", "-",
                              f"{s3.endpoint}/{self._log}/{name}"],
                             input=f'user = "{s3.access_key}:{s3.secret_key}"\n'.encode(),  # not in argv
                             capture_output=True, timeout=10, check=True)
        return got.stdout

    def _watch(self) -> None:
        deadline = time.monotonic() + 120
        for _ in range(5_000):
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            try:
                for name, size in self.listing().items():
                    if name.endswith(".checkpoint.parquet") and name not in self.first_sizes:
                        self.first_sizes[name] = size
                        rows = pq.read_metadata(self._fs.open_input_file(f"{self._log}/{name}")).num_rows
                        if rows < 1:
                            self.errors.append(f"{name}: {rows} rows")
                    elif name == "_last_checkpoint":
                        json.loads(self._get(name))["version"]
                        self.last_checkpoint_reads += 1
            except Exception as exc:  # noqa: BLE001 - asserted by the test
                self.errors.append(repr(exc))
            self.passes += 1
            time.sleep(0.1)

    def settle(self) -> None:
        """Wait for a whole listing pass that started after the last write."""
        target = self.passes + 2
        eventually(lambda: self.passes >= target or not self._thread.is_alive(), 10, what="a whole listing pass",
                   interval=0.02)

    def __enter__(self) -> _LogWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _s3a_counters(spark: Any, uri: str) -> dict[str, int]:
    """The S3A filesystem's request counters in the session's JVM (the instance every Spark task
    and the driver use for this bucket)."""
    jvm = spark._jvm
    fs = jvm.org.apache.hadoop.fs.Path(storage.spark_uri(uri)).getFileSystem(spark._jsc.hadoopConfiguration())
    counters = fs.getIOStatistics().counters()
    return {k: int(counters.get(k)) for k in counters.keySet()}


def test_checkpoints_on_s3_appear_only_whole_to_a_concurrent_delta_rs_reader(s3_spark: Any, s3_root: str,
                                                                             tmp_path: Path) -> None:
    """Spark (S3A) and delta-rs (object_store) both write `N.checkpoint.parquet` under its final
    name on S3, and overwrite `_last_checkpoint` in place: S3 has no rename.

    That is safe because S3 makes an object visible only when the request that writes it completes:
    a PUT (S3A uploads a file this small at close()), or for a large one a multipart upload, at
    CompleteMultipartUpload. Until then a GET or LIST sees no object, or the previous version of an
    overwritten one (S3 is strongly consistent), never a prefix; a writer killed mid-upload leaves
    nothing under the name. So S3ConditionalLogStore tells Delta partial writes are not visible,
    and Spark writes checkpoints in place there. What would break it: a store behind `s3a://` that
    shows an object while it is written (a file-backed gateway, a filesystem mounted in S3's
    place, appends to an existing object as S3 Express One Zone allows); readers would then meet
    torn checkpoints as they did on a local filesystem written in place. So would a reader that
    takes an object's size from one request and its bytes from another (a HEAD, then a ranged
    GET, as pyarrow reads) when the object is overwritten in between: `_last_checkpoint` is, and
    such a read returned the new object cut to the old size. delta-rs reads it with one GET.

    Here both writers commit with `delta.checkpointInterval=1` (a checkpoint per commit) while a
    delta-rs thread loads the latest version and reads all its rows, and another lists the log and
    opens each checkpoint the moment it is first listed. S3A's counters show how Spark's objects
    got there: single PUTs, no multipart upload."""
    settings = settings_for(tmp_path / "data", tables_uri=s3_root)
    create_topic(settings, "orders", partitions=2)
    uri = Layout.of(settings).topic_table("orders")
    produce(settings, "orders", 0, 3)
    delta.load(uri).alter.set_table_properties({"delta.checkpointInterval": "1"})

    stop = threading.Event()
    seen: list[tuple[int, int]] = []  # (version, rows) of each load
    errors: list[BaseException] = []

    def reader() -> None:
        deadline = time.monotonic() + 120
        for _ in range(5_000):
            if stop.is_set() or time.monotonic() > deadline:
                return
            try:
                table = delta.load(uri)
                data = table.to_pyarrow_table(columns=["partition", "offset", "value"])
                assert data.column("value").null_count == 0
                seen.append((table.version(), data.num_rows))
            except Exception as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)
            time.sleep(0.05)  # leaves the writers most of the 2 cores

    rounds = 3
    before = _s3a_counters(s3_spark, uri)
    thread = threading.Thread(target=reader, name="delta-rs-reader")
    with _LogWatch(uri) as watch:
        thread.start()
        try:
            for n in range(rounds):  # each commit, Spark's or delta-rs's, writes a checkpoint
                s3_spark.sql(f"INSERT INTO delta.`{storage.spark_uri(uri)}` VALUES "
                             f"(1, {n}, current_timestamp(), 'k', X'76', 'text', NULL, NULL, NULL, NULL)")
                produce(settings, "orders", 0, 3)
            watch.settle()
        finally:
            stop.set()
            thread.join(timeout=60)
    after = _s3a_counters(s3_spark, uri)

    assert not errors, errors[:3]
    assert not watch.errors, watch.errors[:3]
    final = watch.listing()
    writers = {v: "spark" if "Apache-Spark" in c.get("engineInfo", "") else "delta-rs" for v, c in commit_infos(uri)}
    checkpointed = [writers[int(name[:20])] for name in final if name.endswith(".checkpoint.parquet")]
    assert checkpointed.count("spark") == rounds and checkpointed.count("delta-rs") >= rounds, checkpointed
    # Every checkpoint was listed, and opened, at its final size: never a part of it.
    assert {n for n in final if n.endswith(".checkpoint.parquet")} == set(watch.first_sizes)
    assert all(final[n] == size for n, size in watch.first_sizes.items()), (watch.first_sizes, final)
    assert watch.last_checkpoint_reads > rounds
    # Spark's objects (a data file, a commit, a checkpoint, _last_checkpoint a round) were single PUTs.
    puts = after["object_put_request"] - before["object_put_request"]
    assert puts >= 4 * rounds, (before, after)
    assert after["object_multipart_initiated"] == before["object_multipart_initiated"], (before, after)

    # Whole rows: each load saw exactly its version's rows, and loads raced most of the commits.
    assert len({v for v, _ in seen}) >= rounds, seen
    for version, rows_seen in set(seen):
        assert rows_seen == delta.load(uri, version).to_pyarrow_table(columns=["offset"]).num_rows, version
    assert delta.load(uri).to_pyarrow_table().num_rows == 3 + rounds * 4
