"""Airflow DAGs for lakebroker's Spark maintenance jobs: one DAG per job.

Each DAG reads like its data flow: list the targets (the topics a job applies to), choose the
runner, run the job's entry point once per target, then check and summarize what the runs
recorded in `_system/job_runs` (as every run is recorded, from the CLI or `lakebroker serve`).

Two runners, chosen per run by the `runner` param, else by the Airflow Variable `lakebroker_runner`
(`AIRFLOW_VAR_LAKEBROKER_RUNNER`), else `python`:

* `python`: `python -m lakebroker.spark_pipeline.jobs.<job>` in the Airflow worker (a mapped `@task.bash`),
  on the `spark_master` setting: the embedded default, local Spark beside Airflow;
* `spark-submit`: the provider's `SparkSubmitOperator` on the `spark_default` connection, which
  names the cluster's master (docker-compose.yml sets `AIRFLOW_CONN_SPARK_DEFAULT`); the job's
  script, arguments, Delta jars and confs come from `lakebroker.spark_pipeline.scheduler.spark_submit_run`.

Nothing heavy happens at import: no pyspark, no Variable.get, no table reads. The logic lives in
library code (spark_pipeline); the tasks call it. Settings come from the worker's environment
(`LAKEBROKER_*`), overridden per run by the DAG params.
"""

from __future__ import annotations

import shlex
from datetime import datetime
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param, dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")
TRIGGER = "airflow"  # the runs' trigger in _system/job_runs
RUNNERS = ("python", "spark-submit")
RUNNER_VARIABLE = "lakebroker_runner"
PARAMS: dict[str, Any] = {
    "data_dir": Param(None, type=["null", "string"], description="Data dir (default LAKEBROKER_DATA_DIR)."),
    "spark_master": Param(None, type=["null", "string"],
                          description="Spark master of the python runner (default the setting); the "
                                      "spark-submit runner takes its master from the spark_default connection."),
    "replication_uri": Param(None, type=["null", "string"], description="Replica location (replication only)."),
    "topic": Param(None, type=["null", "string"],
                   description="Only this topic (ignored by offsets compaction and replication)."),
    "runner": Param(None, type=["null", "string"], enum=[None, *RUNNERS],
                    description=f"python or spark-submit (default: the Variable {RUNNER_VARIABLE}, else python)."),
}


def _settings(params: dict[str, Any]) -> Any:
    from lakebroker.tables.settings import Settings

    overrides = {key: params[key] for key in ("data_dir", "spark_master", "replication_uri") if params.get(key)}
    return Settings(**overrides)


def _targets(job: str, params: dict[str, Any]) -> list[str]:
    """Topics the job applies to ("" = the job's own table set, for offsets and replication)."""
    from lakebroker.spark_pipeline.jobs.common import select_topics
    from lakebroker.tables.layout import Layout
    from lakebroker.tables.topics import CleanupPolicy

    if job in ("offsets-compaction", "replication"):
        return [""]  # whole-table jobs: their entry points take no --topic, so the param does not apply
    topics = select_topics(Layout.of(_settings(params)), params.get("topic"))
    if job == "key-compaction":
        topics = [t for t in topics if t.cleanup_policy is CleanupPolicy.COMPACT]
    return [t.name for t in topics]


def _runner(params: dict[str, Any]) -> str:
    """The param, else the Variable (read at run time, never at import), else python."""
    runner = params.get("runner")
    if not runner:
        from airflow.sdk import Variable

        runner = Variable.get(RUNNER_VARIABLE, default="python")
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r} is not one of {', '.join(RUNNERS)}")
    return str(runner)


def _command(job: str, target: str, params: dict[str, Any]) -> str:
    """The python runner's command line."""
    from lakebroker.spark_pipeline.scheduler import job_command
    from lakebroker.tables.job_runs import JobName

    return shlex.join(job_command(JobName(job), _settings(params), topic=target or None, trigger=TRIGGER))


def _submission(job: str, target: str, params: dict[str, Any]) -> dict[str, Any]:
    """The spark-submit runner's SparkSubmitOperator arguments for one target."""
    from lakebroker.spark_pipeline.scheduler import spark_submit_run
    from lakebroker.tables.job_runs import JobName

    run = spark_submit_run(JobName(job), _settings(params), topic=target or None, trigger=TRIGGER)
    return run.operator_kwargs()


def _summary(job: str, targets: list[str], params: dict[str, Any], since: datetime) -> dict[str, Any]:
    """What this DAG run's job runs recorded: one run per target (max_active_runs=1, so the runs
    with this trigger since the DAG run started are its own), none failed."""
    from lakebroker.tables import job_runs
    from lakebroker.tables.layout import Layout

    rows = [r for r in job_runs.last_runs(Layout.of(_settings(params)), job=job, since=since, limit=10_000)
            if r["trigger"] == TRIGGER]
    runs = {r["run_id"] for r in rows}
    if len(runs) != len(targets):
        raise RuntimeError(f"{len(runs)} {job} runs recorded in _system/job_runs for {len(targets)} targets")
    failed = [r["target"] or "(the run)" for r in rows if r["outcome"] == "failed"]
    if failed:
        raise RuntimeError(f"failed on {', '.join(failed)}")
    return {"runs": len(runs), "tables": sum(1 for r in rows if r["target"]),
            "rows_removed": sum(r["rows_removed"] or 0 for r in rows), "run_ids": sorted(runs)}


def maintenance_dag(job: str, schedule: str, doc: str) -> Any:
    @dag(dag_id=f"lakebroker_{job.replace('-', '_')}", schedule=schedule, start_date=START, catchup=False,
         max_active_runs=1, tags=["lakebroker", "spark"], params=PARAMS, doc_md=doc)
    def maintenance() -> None:
        @task
        def targets(params: dict[str, Any] | None = None) -> list[str]:
            return _targets(job, params or {})

        @task.branch
        def choose_runner(params: dict[str, Any] | None = None) -> str:
            return "run_job" if _runner(params or {}) == "python" else "submissions"

        @task.bash
        def run_job(target: str, params: dict[str, Any] | None = None) -> str:
            return _command(job, target, params or {})

        @task
        def submissions(names: list[str], params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
            return [_submission(job, name, params or {}) for name in names]

        @task(trigger_rule="none_failed_min_one_success")
        def summarize(names: list[str], params: dict[str, Any] | None = None,
                      dag_run: Any = None) -> dict[str, Any]:
            return _summary(job, list(names), params or {}, dag_run.start_date)

        names: Any = targets()  # an XComArg: the tasks below take it as the list it resolves to
        branch = choose_runner()
        python_runs = run_job.expand(target=names)
        specs = submissions(names)
        cluster_runs = SparkSubmitOperator.partial(task_id="spark_submit", conn_id="spark_default").expand_kwargs(specs)
        names >> branch >> [python_runs, specs]
        [python_runs, cluster_runs] >> summarize(names)

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
