"""Airflow DAGs for lakebroker's Spark maintenance jobs: one DAG per job.

Each DAG reads like its data flow: list the targets (the topics a job applies to), run the job's
entry point once per target (a mapped `@task.bash`: `python -m spark_pipeline.jobs.<job>`, or
`spark-submit` on the cluster when the `spark_submit` param is set), then summarize the runs
(every run is also recorded in `_system/job_runs`, as from the CLI or `lakebroker serve`).

Nothing heavy happens at import: no pyspark, no Variable.get, no table reads. The logic lives in
library code (spark_pipeline); the tasks call it. Settings come from the worker's environment
(`LAKEBROKER_*`), overridden per run by the DAG params.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pendulum
from airflow.sdk import Param, dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")
PARAMS: dict[str, Any] = {
    "data_dir": Param(None, type=["null", "string"], description="Data dir (default LAKEBROKER_DATA_DIR)."),
    "spark_master": Param(None, type=["null", "string"], description="Spark master (default the setting)."),
    "replication_uri": Param(None, type=["null", "string"], description="Replica location (replication only)."),
    "topic": Param(None, type=["null", "string"],
                   description="Only this topic (ignored by offsets compaction and replication)."),
    "spark_submit": Param(False, type="boolean", description="Run through spark-submit instead of python -m."),
}


def _settings(params: dict[str, Any]) -> Any:
    from tables.settings import Settings

    overrides = {key: params[key] for key in ("data_dir", "spark_master", "replication_uri") if params.get(key)}
    return Settings(**overrides)


def _targets(job: str, params: dict[str, Any]) -> list[str]:
    """Topics the job applies to ("" = the job's own table set, for offsets and replication)."""
    from spark_pipeline.jobs.common import select_topics
    from tables.layout import Layout
    from tables.topics import CleanupPolicy

    if job in ("offsets-compaction", "replication"):
        return [""]  # whole-table jobs: their entry points take no --topic, so the param does not apply
    topics = select_topics(Layout.of(_settings(params)), params.get("topic"))
    if job == "key-compaction":
        topics = [t for t in topics if t.cleanup_policy is CleanupPolicy.COMPACT]
    return [t.name for t in topics]


def _command(job: str, target: str, params: dict[str, Any]) -> str:
    from spark_pipeline.results import JobName
    from spark_pipeline.scheduler import job_command, spark_submit_command

    settings = _settings(params)
    build = spark_submit_command if params.get("spark_submit") else job_command
    return shlex.join(build(JobName(job), settings, topic=target or None, trigger="airflow"))


def _summary(outputs: list[str]) -> dict[str, Any]:
    """Each run prints its result as one JSON line (the bash task's XCom)."""
    runs = []
    for line in outputs:
        try:
            runs.append(json.loads(line))
        except (TypeError, ValueError):
            continue  # not a result line: the run is still in _system/job_runs
    failed = [t["target"] for r in runs for t in r["tables"] if t["outcome"] == "failed"]
    if failed:
        raise RuntimeError(f"failed on {', '.join(failed)}")
    return {"runs": len(runs), "tables": sum(len(r["tables"]) for r in runs),
            "rows_removed": sum(t.get("rows_removed") or 0 for r in runs for t in r["tables"]),
            "run_ids": [r["run_id"] for r in runs]}


def maintenance_dag(job: str, schedule: str, doc: str) -> Any:
    @dag(dag_id=f"lakebroker_{job.replace('-', '_')}", schedule=schedule, start_date=START, catchup=False,
         max_active_runs=1, tags=["lakebroker", "spark"], params=PARAMS, doc_md=doc)
    def maintenance() -> None:
        @task
        def targets(params: dict[str, Any] | None = None) -> list[str]:
            return _targets(job, params or {})

        @task.bash
        def run_job(target: str, params: dict[str, Any] | None = None) -> str:
            return _command(job, target, params or {})

        @task
        def summarize(outputs: list[str]) -> dict[str, Any]:
            return _summary(list(outputs))

        summarize(run_job.expand(target=targets()))

    return maintenance()


compaction = maintenance_dag("compaction", "*/15 * * * *",
                             "Bin-pack small files of every topic into ordered files; checkpoint the log.")
retention = maintenance_dag("retention", "*/15 * * * *",
                            "Apply retention; move lagging consumer groups forward (recorded); VACUUM.")
key_compaction = maintenance_dag("key-compaction", "0 * * * *",
                                 "Keep the latest value per key of cleanup_policy=compact topics.")
offsets_compaction = maintenance_dag("offsets-compaction", "0 3 * * *",
                                     "Keep the latest offset per consumer group and partition.")
replication = maintenance_dag("replication", "*/5 * * * *",
                              "Copy every table incrementally to the replica (params.replication_uri).")
