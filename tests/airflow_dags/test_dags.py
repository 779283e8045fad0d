"""The maintenance DAGs: they import cleanly, and each of the five really runs (dag.test) against local tables."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from lakebroker.spark_pipeline.session import use_class_archive
from lakebroker.tables import job_runs
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import OffsetReason, OffsetsTable
from lakebroker.tables.settings import Settings
from tests.servers import free_port
from tests.spark_pipeline.topics import (
    NOW_US,
    create_topic,
    file_count,
    log_ends,
    offsets_by_partition,
    produce,
    rows,
    settings_for,
)
from tests.test_docs import spark_jobs_table

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DAG_IDS = {"lakebroker_compaction", "lakebroker_retention", "lakebroker_key_compaction",
           "lakebroker_offsets_compaction", "lakebroker_replication"}


def _dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "airflow_dags"))


def test_dags_import_without_errors_or_heavy_imports(airflow_db: Path) -> None:
    already = "pyspark" in sys.modules
    bag = _dagbag()
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == DAG_IDS
    if not already:
        assert "pyspark" not in sys.modules  # nothing heavy at import time
    for dag_id in DAG_IDS:
        dag = bag.get_dag(dag_id)
        assert {t.task_id for t in dag.tasks} == {"targets", "choose_runner", "run_job", "submissions",
                                                  "spark_submit", "summarize"}
        assert dag.max_active_runs == 1 and not dag.catchup
        assert dag.get_task("choose_runner").downstream_task_ids == {"run_job", "submissions"}
        submit = dag.get_task("spark_submit")  # the provider's operator, on the spark_default connection
        assert submit.operator_name == "SparkSubmitOperator" and submit.partial_kwargs["conn_id"] == "spark_default"
        assert dag.get_task("summarize").upstream_task_ids == {"targets", "run_job", "spark_submit"}
    # docs/spark-jobs.md's table names each DAG and its schedule.
    named = {}
    for row in spark_jobs_table():
        if row["Airflow DAG (schedule)"] != "none":
            dag_id, schedule = re.fullmatch(r"`(\w+)` \(`([^`]+)`\)", row["Airflow DAG (schedule)"]).groups()  # type: ignore[union-attr]
            named[dag_id] = schedule
    assert set(named) == DAG_IDS
    for dag_id, schedule in named.items():
        assert bag.get_dag(dag_id).timetable.expression == schedule, dag_id


def _run(bag: Any, dag_id: str, **conf: str) -> dict[str, str]:
    """Run the DAG with dag.test(); the state of each task (a mapped task: of its instances, if all agree)."""
    run = bag.get_dag(dag_id).test(run_conf=conf)
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), (dag_id, run.state)
    states: dict[str, set[str]] = {}
    for ti in run.get_task_instances():
        states.setdefault(ti.task_id, set()).add(str(ti.state).removeprefix("TaskInstanceState."))
    return {task: "/".join(sorted(s)) for task, s in states.items()}


def _replica_rows(replica: Path, topic: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for r in DeltaTable(str(replica / "topics" / topic)).to_pyarrow_table(columns=["partition"]).to_pylist():
        counts[r["partition"]] = counts.get(r["partition"], 0) + 1
    return counts


def _rows_per_partition(settings: Settings, topic: str) -> dict[int, int]:
    return {p: len(v) for p, v in offsets_by_partition(settings, topic).items()}


@pytest.mark.timeout(1200)  # a long chain of Spark jobs: minutes when the suite runs in parallel
def test_every_dag_runs_for_real_and_does_its_job(airflow_db: Path, tmp_path: Path) -> None:
    """All five DAGs through dag.test() on one data dir, in the order that shows each effect:
    retention drops the expired files (and moves a lagging group), compaction then merges what is
    left, key compaction keeps the latest value per key, offsets compaction one row per group and
    partition, and replication copies it all. Settings come as DAG params, as in production."""
    settings = settings_for(tmp_path / "data")
    layout = Layout(settings.data_dir)
    replica = tmp_path / "replica"
    create_topic(settings, "events", partitions=2, retention_ms=3_600_000)
    old = NOW_US() - 2 * 3_600_000_000
    for _ in range(3):
        produce(settings, "events", 0, 10, ts_us=old)  # 0-29 expired
    produce(settings, "events", 1, 10, ts_us=old)  # 0-9 expired
    for i in range(5):
        produce(settings, "events", 0 if i < 2 else 1, 10)  # p0: 30-49, p1: 10-39, fresh
    create_topic(settings, "users", partitions=1, cleanup_policy="compact")
    produce(settings, "users", 0, 6, ts_us=old, keys=["a", "b", "a", "c", "b", "a"],
            values=[b"a0", b"b1", b"a2", b"c3", b"b4", b"a5"])
    offsets = OffsetsTable(layout)
    for n in range(1, 4):
        offsets.commit("current", "events", {0: 40 + n, 1: 30 + n}, OffsetReason.ACK)
    offsets.commit("lagging", "events", {0: 5, 1: 12}, OffsetReason.ACK)
    ends = log_ends(settings, "events", 2)
    assert file_count(settings, "events") == 9

    bag = _dagbag()
    conf = {"data_dir": str(settings.data_dir), "spark_master": "local[1]"}

    states = _run(bag, "lakebroker_retention", **conf, topic="events")
    assert states["run_job"] == "success" and states["spark_submit"] == "skipped"  # python: the default runner
    kept = {0: list(range(30, 50)), 1: list(range(10, 40))}
    assert offsets_by_partition(settings, "events") == kept  # the expired files went, the log starts moved
    assert log_ends(settings, "events", 2) == ends
    assert offsets.latest()[("lagging", "events", 0)] == (30, OffsetReason.RETENTION_SKIP.value)
    assert offsets.latest()[("lagging", "events", 1)] == (12, OffsetReason.ACK.value)  # not behind: untouched

    _run(bag, "lakebroker_compaction", **conf, topic="events")
    assert file_count(settings, "events") == 2  # p0: 2 files -> 1, p1: 3 -> 1
    assert offsets_by_partition(settings, "events") == kept

    _run(bag, "lakebroker_key_compaction", **conf)
    assert {(r["key"], r["offset"], r["value"]) for r in rows(settings, "users")} == {
        ("c", 3, b"c3"), ("b", 4, b"b4"), ("a", 5, b"a5")}

    positions = offsets.latest()
    assert len(DeltaTable(layout.offsets_table).to_pyarrow_table().to_pylist()) == 9
    _run(bag, "lakebroker_offsets_compaction", **conf)
    compacted = DeltaTable(layout.offsets_table).to_pyarrow_table(columns=["group", "topic", "partition"])
    keys = [(r["group"], r["topic"], r["partition"]) for r in compacted.to_pylist()]
    assert sorted(keys) == sorted(positions) and len(keys) == 4  # one row per group, topic and partition
    assert offsets.latest() == positions

    _run(bag, "lakebroker_replication", **conf, replication_uri=str(replica))
    for topic in ("events", "users"):
        assert _replica_rows(replica, topic) == _rows_per_partition(settings, topic), topic
    replica_offsets = DeltaTable(str(replica / "_system" / "consumer_offsets")).to_pyarrow_table()
    assert replica_offsets.num_rows == len(keys)

    runs = job_runs.last_runs(Layout(settings.data_dir), limit=100)
    assert {(r["job"], r["target"], r["trigger"], r["outcome"]) for r in runs} >= {
        ("retention", "events", "airflow", "ok"), ("compaction", "events", "airflow", "ok"),
        ("key-compaction", "users", "airflow", "ok"),
        ("offsets-compaction", "_system/consumer_offsets", "airflow", "ok"),
        ("replication", "events", "airflow", "ok"), ("replication", "users", "airflow", "ok")}


@pytest.mark.timeout(900)
def test_a_dag_runs_against_tables_on_s3(airflow_db: Path, tmp_path: Path, s3_root: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The table root in a bucket (MinIO), as the Airflow worker's environment gives it: the job
    finds the topic there, removes the expired rows there, and records its run there."""
    monkeypatch.setenv("LAKEBROKER_TABLES_URI", s3_root)
    settings = settings_for(tmp_path / "data", tables_uri=s3_root)
    create_topic(settings, "events", partitions=1, retention_ms=3_600_000)
    produce(settings, "events", 0, 10, ts_us=NOW_US() - 2 * 3_600_000_000)  # 0-9 expired
    produce(settings, "events", 0, 5)
    states = _run(_dagbag(), "lakebroker_retention", data_dir=str(settings.data_dir), spark_master="local[1]")
    assert states["run_job"] == "success" and states["summarize"] == "success"
    assert offsets_by_partition(settings, "events") == {0: list(range(10, 15))}
    runs = job_runs.last_runs(Layout.of(settings), job="retention", limit=10)
    assert [(r["target"], r["trigger"], r["outcome"]) for r in runs] == [("events", "airflow", "ok")]
    assert not (settings.data_dir / "topics").exists()


def test_a_topic_param_reaches_only_the_jobs_that_take_one(airflow_db: Path, tmp_path: Path) -> None:
    import airflow_dags.lakebroker_maintenance as dags

    settings = settings_for(tmp_path / "data")
    create_topic(settings, "events", partitions=1)
    params = {"data_dir": str(settings.data_dir), "topic": "events"}
    for job in ("offsets-compaction", "replication"):
        assert dags._targets(job, params) == [""]
        assert "--topic" not in dags._command(job, "", {**params, "replication_uri": str(tmp_path / "r")})
    assert dags._targets("compaction", params) == ["events"]
    assert "--topic events" in dags._command("compaction", "events", params)


@pytest.mark.timeout(900)
def test_the_spark_submit_runner_submits_through_the_spark_default_connection(
        airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster path: the Variable picks the spark-submit runner, and the provider's SparkSubmitOperator
    submits the job to the master the spark_default connection names (here local[2], with real
    spark-submit). The setting LAKEBROKER_SPARK_MASTER points at nothing: had the job used it rather
    than the connection's master, it could not have run. One DAG (one JVM): the runner is the same for all."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("AIRFLOW_VAR_LAKEBROKER_RUNNER", "spark-submit")
    monkeypatch.setenv("LAKEBROKER_SPARK_MASTER", f"spark://127.0.0.1:{free_port()}")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # spark-submit
    # The driver JVM maps the class archive, as the python runner's does (build_spark_session): a faster start.
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", os.environ.get("SPARK_SUBMIT_OPTS", ""))
    use_class_archive()
    settings = settings_for(tmp_path / "data")
    create_topic(settings, "events", partitions=2)
    for i in range(6):
        produce(settings, "events", i % 2, 10)
    before, ends = offsets_by_partition(settings, "events"), log_ends(settings, "events", 2)
    assert file_count(settings, "events") == 6

    states = _run(_dagbag(), "lakebroker_compaction", data_dir=str(settings.data_dir), topic="events")
    assert states["spark_submit"] == "success" and states["run_job"] == "skipped"
    assert states["summarize"] == "success"
    assert file_count(settings, "events") == 2
    assert offsets_by_partition(settings, "events") == before and log_ends(settings, "events", 2) == ends
    (run,) = job_runs.last_runs(Layout(settings.data_dir), job="compaction")
    assert (run["target"], run["trigger"], run["outcome"]) == ("events", "airflow", "ok")
