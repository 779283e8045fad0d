"""docs/analysts.md, run for real: every SQL example through Spark (time travel by version and by
timestamp, DESCRIBE HISTORY), every Python example (DuckDB, Polars, delta-rs) without Spark."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakebroker.spark_pipeline.catalog import register_tables
from lakebroker.spark_pipeline.jobs import compaction
from lakebroker.spark_pipeline.plan_metrics import scan_metrics
from lakebroker.spark_pipeline.plans import FileEntry
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import OffsetReason, OffsetsTable
from tests.spark_pipeline.topics import create_topic, produce, settings_for

pytestmark = pytest.mark.spark

DOC = Path(__file__).resolve().parents[2] / "docs" / "analysts.md"
PLACEHOLDER_TIME = "2026-01-15 09:30:00"


def _blocks(language: str, *, with_spark: bool = False) -> list[str]:
    """The page's code blocks in `language`; python ones with a Spark session (`lakebroker.spark`)
    only when `with_spark`, the others only when not."""
    found = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)
    return found if language != "python" else [b for b in found if ("lakebroker.spark " in b) == with_spark]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("analysts")
    settings = settings_for(root / "data", compaction_target_file_bytes=12_000)
    create_topic(settings, "orders", partitions=3)
    create_topic(settings, "payments", partitions=3)
    for batch in range(8):
        for p in range(3):
            n = 25
            keys = [f"customer-{(batch * n + i) % 50}" for i in range(n)]
            values = [json.dumps({"total": batch * 100 + i}).encode() for i in range(n)]
            produce(settings, "orders", p, n, keys=keys, values=values)
            time.sleep(0.01)  # distinct commit times, for time travel by timestamp
    for p in range(3):
        keys = [f"customer-{i}" for i in range(10)]
        produce(settings, "payments", p, 10, keys=keys,
                values=[json.dumps({"method": "card"}).encode() for _ in keys])
    offsets = OffsetsTable(Layout(settings.data_dir))
    offsets.commit("billing", "orders", {0: 150, 1: 120, 2: 200}, OffsetReason.ACK)
    offsets.commit("billing", "orders", {1: 160}, OffsetReason.ACK)
    yield root


def test_sql_examples_run_with_time_travel_and_history(spark: Any, data: Path) -> None:
    settings = settings_for(data / "data", compaction_target_file_bytes=12_000)
    assert compaction.run(spark, settings, "orders").outcome.value == "ok"  # history shows OPTIMIZE too
    register_tables(spark, Layout(settings.data_dir))
    orders = Layout(settings.data_dir).topic_table("orders")
    history = spark.sql("DESCRIBE HISTORY orders").collect()
    v3 = next(h for h in history if h.version == 3)
    at_v3 = v3.timestamp.strftime("%Y-%m-%d %H:%M:%S.%f")
    rows_v3 = DeltaTable(orders, version=3).to_pyarrow_table().num_rows

    results = []
    for sql in _blocks("sql"):
        frame = spark.sql(sql.replace(PLACEHOLDER_TIME, at_v3))
        results.append((sql, frame, frame.collect()))
    assert len(results) == 7, [sql.splitlines()[0] for sql, _, _ in results]
    key_rows, range_rows, lag_rows, join_rows, hist_rows, version_rows, time_rows = (r for _, _, r in results)

    assert len(key_rows) == 8 * 3 * 25 // 50 and all(json.loads(r.value)["total"] >= 0 for r in key_rows)
    assert [r.offset for r in range_rows] == list(range(100, 150))
    assert [(r.group, r.partition, r.lag, r.last_reason) for r in lag_rows] == [
        ("billing", 0, 50, "ack"), ("billing", 1, 40, "ack"), ("billing", 2, 0, "ack")]
    assert len(join_rows) == 10 * 12 * 3 and join_rows[0].method == "card"  # 10 paid keys x 12 orders x 3 payments
    operations = {h.operation for h in hist_rows}
    assert {"WRITE", "OPTIMIZE", "CREATE TABLE"} <= operations
    assert sum(r.messages for r in version_rows) == rows_v3 == 50  # create, properties, two appends
    assert sum(r.messages for r in time_rows) == rows_v3

    # The offset-range query opens only the files that hold offsets 100-149 of partition 1.
    files = [FileEntry.from_add(a["path"], {"partition": str(a["partition.partition"])}, a["size_bytes"],
                                json.dumps({"numRecords": a["num_records"], "minValues": {"offset": a["min.offset"]},
                                            "maxValues": {"offset": a["max.offset"]}}))
             for a in pa.table(DeltaTable(orders).get_add_actions(flatten=True)).to_pylist()]
    holding = [f for f in files if f.partition == 1 and (f.min_offset or 0) <= 149 and (f.max_offset or 0) >= 100]
    assert len(files) > len(holding) >= 1
    range_frame = results[1][1]
    read = scan_metrics(range_frame)
    assert read.files_read == len(holding), (read, len(holding), len(files))


def test_python_examples_run_without_spark(data: Path) -> None:
    cwd = os.getcwd()
    os.chdir(data)
    try:
        namespace: dict[str, Any] = {}
        for code in _blocks("python"):
            exec(compile(code, str(DOC), "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert namespace["per_partition"] == [(0, 200, 200), (1, 200, 200), (2, 200, 200)]
    assert len(namespace["joined"]) == 10 * 12 * 3
    by_key = namespace["by_key"]
    assert by_key.height == 12 and by_key["value"].str.contains("total").all()
    assert sorted(namespace["window"].column("offset").to_pylist()) == list(range(100, 150))
    assert namespace["as_of_version_3"] == 50
    assert namespace["history"]


def test_the_dataframe_example_reads_positions(spark: Any, data: Path) -> None:
    (code,) = [b for b in _blocks("python", with_spark=True) if "read_topic(" in b]
    cwd = os.getcwd()
    os.chdir(data)  # the example's settings are the environment's: ./data
    try:
        namespace: dict[str, Any] = {"spark": spark}
        exec(compile(code, str(DOC), "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert namespace["orders"].count() == 3 * 200
    assert sorted(r["offset"] for r in namespace["window"].collect()) == list(range(100, 150))
    since = namespace["since_v3"].count()
    os.chdir(data)
    try:
        from lakebroker.spark import TableVersion, read_topic

        before = read_topic(spark, "orders", ending=TableVersion(3)).count()
    finally:
        os.chdir(cwd)
    assert 0 < since < 600 and since + before == 600, (since, before)
    assert namespace["this_year"].count() == 600, "written this year"
    totals = namespace["totals"].collect()
    assert len(totals) == 600 and all(r["total"] is not None for r in totals)


def test_sql_registers_only_the_tables_a_statement_names(spark: Any, tmp_path: Path) -> None:
    """`lakebroker sql` (sql_over_tables) reads the log of the tables its statement names, not of
    every topic: each registration costs a Delta log read. SHOW lists them all; names are matched
    as Spark matches them (any case, back-quoted, qualified)."""
    from pyspark.errors import AnalysisException

    from lakebroker.spark_pipeline.catalog import sql_over_tables

    settings = settings_for(tmp_path / "data")
    layout = Layout(settings.data_dir)
    for name in ("lazy_named", "lazy_other"):
        create_topic(settings, name, partitions=1)
        produce(settings, name, 0, 4)
    OffsetsTable(layout).commit("g", "lazy_named", {0: 2}, OffsetReason.ACK)

    def registered(name: str) -> bool:
        return bool(spark.catalog.tableExists(name))

    # The shared session's catalog may hold another test's data dir under this name (external: drop
    # removes the entry only); a `lakebroker sql` process starts with an empty catalog.
    spark.sql("DROP TABLE IF EXISTS lakebroker.consumer_offsets")

    assert not registered("lazy_named") and not registered("lazy_other")
    assert sql_over_tables(spark, layout, "SELECT count(*) FROM LAZY_NAMED").first()[0] == 4
    assert registered("lazy_named") and not registered("lazy_other")
    joined = sql_over_tables(spark, layout, "SELECT o.offset FROM `lazy_named` t JOIN lakebroker.consumer_offsets o "
                                            "ON o.topic = 'lazy_named' AND t.offset = o.offset")
    assert [r[0] for r in joined.collect()] == [2]
    assert not registered("lazy_other")
    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_NOT_FOUND"):
        sql_over_tables(spark, layout, "SELECT * FROM lazy_missing")
    listed = {r["tableName"] for r in sql_over_tables(spark, layout, "SHOW TABLES").collect()}
    assert {"lazy_named", "lazy_other"} <= listed
