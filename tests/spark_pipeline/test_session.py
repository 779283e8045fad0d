"""The Spark session factory: local Delta jars, and put-if-absent commits shared with delta-rs."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from py4j.protocol import Py4JJavaError

from lakebroker.spark_pipeline.session import (
    LOGSTORE_CLASS,
    jar_paths,
)
from tests.dir_events import DirEvents

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64()), ("src", pa.string())])


# `spark` is the run's shared session (tests/spark_fixtures.py, via conftest.py).


def _log_versions(table: Path) -> list[int]:
    names = [p.name for p in (table / "_delta_log").iterdir()]
    return sorted(int(n[:20]) for n in names if re.fullmatch(r"\d{20}\.json", n))


def _commit_info(table: Path, version: int) -> dict[str, Any]:
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    for line in text.splitlines():
        action = json.loads(line)
        if "commitInfo" in action:
            info: dict[str, Any] = action["commitInfo"]
            return info
    raise AssertionError(f"version {version} has no commitInfo")


def test_jar_paths_missing_dir_names_spark_setup(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="run `lakebroker spark setup`"):
        jar_paths(tmp_path / "nope")


def test_delta_round_trip(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    spark.createDataFrame([(1, "a"), (2, "b")], "id long, src string").write.format("delta").save(path)

    rows = spark.read.format("delta").load(path).orderBy("id").collect()
    assert [(r.id, r.src) for r in rows] == [(1, "a"), (2, "b")]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "WRITE")]


def test_no_network_package_resolution(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert not conf.contains("spark.jars.packages")
    assert spark.conf.get("spark.jars.packages", None) is None
    assert all(jar.startswith("/") for jar in conf.get("spark.jars").split(","))


def test_logstore_write_is_put_if_absent(spark: Any, tmp_path: Path) -> None:
    jvm = spark._jvm
    table = tmp_path / "t"
    spark.range(1).write.format("delta").save(str(table))
    target = jvm.org.apache.hadoop.fs.Path((table / "_delta_log").as_uri() + "/" + f"{1:020d}.json")

    # The store Delta itself uses for this table, not just an instance of our class.
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(table))
    store = delta_log.store().getDelegate(target).logStoreImpl()
    assert store.getClass().getName() == LOGSTORE_CLASS
    hadoop_conf = spark._jsc.hadoopConfiguration()
    # True so that checkpoints are renamed into place; commits below stay put-if-absent regardless.
    assert store.isPartialWriteVisible(target, hadoop_conf)

    def lines(*texts: str) -> Any:
        java_list = jvm.java.util.ArrayList()
        for text in texts:
            java_list.add(text)
        return java_list.iterator()

    store.write(target, lines('{"first":1}', '{"first":2}'), False, hadoop_conf)
    with pytest.raises(Py4JJavaError) as excinfo:
        store.write(target, lines('{"second":1}'), False, hadoop_conf)
    java_exc = excinfo.value.java_exception
    assert java_exc.getClass().getName() == "java.nio.file.FileAlreadyExistsException"

    log = table / "_delta_log"
    assert (log / f"{1:020d}.json").read_text() == '{"first":1}\n{"first":2}\n'
    assert not [p.name for p in log.iterdir() if p.name.endswith(".tmp")]


def test_spark_and_delta_rs_commit_concurrently(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "race"
    uri = str(table)
    write_deltalake(uri, pa.table({"id": [0], "src": ["seed"]}, schema=SCHEMA))

    rs_appends, max_spark_rounds, deadline = 30, 12, time.monotonic() + 240
    rs_ids = list(range(1_000, 1_000 + rs_appends))

    def delta_rs_writer() -> list[int]:
        rng, done = random.Random(7), []
        for row_id in rs_ids:
            if time.monotonic() > deadline:
                break
            write_deltalake(uri, pa.table({"id": [row_id], "src": ["rs"]}, schema=SCHEMA), mode="append")
            done.append(row_id)
            time.sleep(rng.uniform(0.1, 0.6))  # spread the appends over several Spark commits
        return done

    spark.read.format("delta").load(uri).count()  # warm up before racing
    spark_ids: list[int] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-rs") as pool:
        writer = pool.submit(delta_rs_writer)
        # Spark keeps committing for as long as delta-rs does (and at least twice).
        for n in range(max_spark_rounds):
            if time.monotonic() > deadline or (n >= 2 and writer.done()):
                break
            ids = [2_000 + 10 * n + i for i in range(3)]
            batch = spark.createDataFrame([(i, "spark") for i in ids], "id long, src string")
            batch.write.format("delta").mode("append").save(uri)
            spark_ids += ids
            spark.sql(f"OPTIMIZE delta.`{uri}`").collect()
        # Re-raises the writer's error, if any; bounded since the writer stops at the deadline.
        rs_done = writer.result(timeout=max(1.0, deadline - time.monotonic()))
    assert rs_done == rs_ids

    versions = _log_versions(table)
    assert versions == list(range(len(versions))), "commit versions must be contiguous"
    assert not [p.name for p in (table / "_delta_log").iterdir() if p.name.endswith(".tmp")]
    commits = [_commit_info(table, v) for v in versions]
    rs_commits = [c for c in commits if c.get("clientVersion", "").startswith("delta-rs")]
    assert len(rs_commits) == 1 + rs_appends  # the create plus every append, none overwritten
    spark_commits = [
        (v, c) for v, c in zip(versions, commits, strict=True) if "Apache-Spark" in c.get("engineInfo", "")
    ]
    assert sum(c["operation"] == "WRITE" for _, c in spark_commits) == len(spark_ids) // 3
    # The race really happened: a Spark commit landed past versions that delta-rs committed
    # after Spark's snapshot, so Spark's first attempt (readVersion + 1) was already taken.
    assert any(c["readVersion"] < v - 1 for v, c in spark_commits), spark_commits

    expected = sorted([0, *rs_ids, *spark_ids])
    spark_rows = spark.read.format("delta").load(uri).select("id").collect()
    assert sorted(r.id for r in spark_rows) == expected
    rs_rows = DeltaTable(uri).to_pyarrow_table().column("id").to_pylist()
    assert sorted(rs_rows) == expected


def test_checkpoints_appear_only_whole_to_a_concurrent_delta_rs_reader(spark: Any, tmp_path: Path) -> None:
    """Spark writes `N.checkpoint.parquet` and `_last_checkpoint` as temp files renamed into place.

    A checkpoint written in place is visible from its first byte: a delta-rs reader that loads the
    table meanwhile fails ("Parquet error: ... Corrupt footer"), and a job killed mid-write leaves
    the torn file for every later reader. Delta renames a temp file instead only when the LogStore
    says partial writes are visible. The directory's inotify events show how each checkpoint got
    its name; a delta-rs thread loads and reads the table throughout and must never fail.
    `_last_checkpoint` is overwritten at each checkpoint: rewritten in place, a concurrent load
    read it empty once ("Wanted range starting at 0, but object was only 0 bytes long")."""
    table = tmp_path / "cp"
    uri = str(table)
    write_deltalake(uri, pa.table({"id": [0], "src": ["seed"]}, schema=SCHEMA))
    spark.sql(f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.checkpointInterval' = '1')")
    events = DirEvents(table / "_delta_log")

    stop = threading.Event()
    reads: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                reads.append(DeltaTable(uri).to_pyarrow_table().num_rows)
            except Exception as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

    thread = threading.Thread(target=reader, name="delta-rs-reader")
    thread.start()
    try:
        rounds = 6
        for n in range(rounds):  # each Spark commit writes a checkpoint (interval 1)
            spark.createDataFrame([(100 + n, "spark")], "id long, src string").write.format("delta") \
                .mode("append").save(uri)
    finally:
        stop.set()
        thread.join(timeout=60)
        events.drain()
        events.close()

    checkpoint = re.compile(r"\d{20}\.checkpoint\.parquet")
    whole = sorted(n for n in events.renamed_in if checkpoint.fullmatch(n))
    torn = sorted(n for n in events.created if checkpoint.fullmatch(n))
    assert torn == [], f"checkpoints created in place (visible half-written): {torn}"
    assert len(whole) >= rounds, (whole, events.created)
    assert "_last_checkpoint" not in events.written + events.created, "_last_checkpoint written in place"
    assert events.renamed_in.count("_last_checkpoint") >= rounds, events.renamed_in
    assert not errors, errors[:3]
    assert reads, "the reader must have loaded the table while Spark wrote"
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 1 + rounds
    assert not [p.name for p in (table / "_delta_log").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("created_again", [True, False])
def test_a_job_commit_never_lands_in_a_table_deleted_while_it_ran(spark: Any, tmp_path: Path,
                                                                 created_again: bool) -> None:
    """A job's transaction reads the table; the topic is deleted (and maybe created again, a new log
    from version 0). Delta finds no conflicting commit after the one it read, so without a check the
    job's commit would land past the new table's end, or rebuild the deleted one."""
    from lakebroker.spark_pipeline.delta_txn import DeltaTxn, TableReplaced
    from lakebroker.tables.layout import Layout
    from lakebroker.tables.settings import Settings
    from lakebroker.tables.storage import remove_tree
    from lakebroker.tables.topics import ensure_topic_table
    from tests.spark_pipeline.topics import create_topic, produce

    settings = Settings(data_dir=tmp_path / "data")
    create_topic(settings, "t", partitions=1)
    for _ in range(3):
        produce(settings, "t", 0, 2)
    table = Path(Layout(settings.data_dir).topic_table("t"))
    txn = DeltaTxn(spark, str(table))
    removes = txn.removes(txn.files(), data_change=False)  # what a compaction would remove
    remove_tree(str(table))
    if created_again:
        ensure_topic_table(str(table))
    before = _log_versions(table) if created_again else []
    with pytest.raises(TableReplaced, match="deleted"):
        txn.commit(removes, txn.optimize_op([]))
    assert (_log_versions(table) if (table / "_delta_log").exists() else []) == before
