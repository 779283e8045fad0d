"""The maintenance DAGs: they import cleanly, and really run (dag.test) against a local topic table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from spark_pipeline import job_runs
from tables.layout import Layout
from tests.spark_pipeline.topics import create_topic, file_count, log_ends, offsets_by_partition, produce, settings_for

pytestmark = pytest.mark.spark

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
        assert [t.task_id for t in dag.tasks] == ["targets", "run_job", "summarize"]
        assert dag.max_active_runs == 1 and not dag.catchup


def test_compaction_and_retention_dags_run_for_real(airflow_db: Path, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    create_topic(settings, "events", partitions=2)
    for i in range(6):
        produce(settings, "events", i % 2, 10)
    ends = log_ends(settings, "events", 2)
    before = offsets_by_partition(settings, "events")
    bag = _dagbag()
    conf = {"data_dir": str(settings.data_dir), "spark_master": "local[1]"}
    for dag_id in ("lakebroker_compaction", "lakebroker_retention"):
        run = bag.get_dag(dag_id).test(run_conf=conf)
        assert str(run.state) in ("success", "DagRunState.SUCCESS"), (dag_id, run.state)
    assert file_count(settings, "events") == 2
    assert offsets_by_partition(settings, "events") == before
    assert log_ends(settings, "events", 2) == ends
    runs = job_runs.last_runs(Layout(settings.data_dir))
    assert {(r["job"], r["target"], r["trigger"], r["outcome"]) for r in runs} >= {
        ("compaction", "events", "airflow", "ok"), ("retention", "events", "airflow", "ok")}
