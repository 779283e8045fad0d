"""CLI commands of the Spark maintenance jobs (compact, retention, replicate, ...).

Each command validates its input before starting Spark (an unknown topic or a bad URI is a
one-line error and a non-zero exit), runs the job in this process on the `spark_master` setting,
records the run in `_system/job_runs`, prints one line per table, and exits 1 if the run failed.
The same jobs run as `python -m lakebroker.spark_pipeline.jobs.<job>` (spark-submit-able), from
`lakebroker serve`'s scheduler, and from the Airflow DAGs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from lakebroker.tables.job_runs import JobName
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings

out = Console()
# What each job's progress display counts as rows (compaction removes none: its display shows files).
ROWS_LABEL = {"retention": "rows removed", "replication": "rows copied"}

TopicArg = Annotated[str | None, typer.Argument(help="Only this topic (default: every topic).")]
ToOption = Annotated[str | None, typer.Option("--to", help="Replica location: a path, file:// or s3a:// URI "
                                                           "(default: the replication_uri setting).")]


def _print_result(result: Any) -> None:
    table = Table("table", "outcome", "files", "rows removed", "seconds", "note", title=(
        f"{result.job.value} run {result.run_id[:12]}: {result.outcome.value}"))
    for t in result.tables:
        files = "" if t.files_before is None else f"{t.files_before} → {t.files_after}"
        note = t.error or t.details.get("reason") or ""
        table.add_row(t.target, t.outcome.value, files, "" if t.rows_removed is None else str(t.rows_removed),
                      f"{t.duration_ms / 1000:.1f}", str(note))
    out.print(table)


def _run_job(settings: Settings, job: str, fail: Callable[[str, int], typer.Exit], **kwargs: Any) -> None:
    from lakebroker.job_progress import job_progress
    from lakebroker.spark_pipeline.jobs import compaction, key_compaction, offsets_compaction, replication, retention
    from lakebroker.spark_pipeline.sql import cli_jvm_log, spark_for
    from lakebroker.tables import job_runs
    from lakebroker.tables.job_runs import Outcome

    modules = {"compaction": compaction, "retention": retention, "key-compaction": key_compaction,
               "offsets-compaction": offsets_compaction, "replication": replication}
    spark = spark_for(settings, f"lakebroker-{job}", jvm_log=cli_jvm_log(settings, job))
    try:
        with job_progress(out, job, ROWS_LABEL.get(job)) as progress:
            if progress is not None and job in ("compaction", "retention", "replication"):
                kwargs["progress"] = progress
            result = modules[job].run(spark, settings, trigger="cli", **kwargs)
    finally:
        spark.stop()
    job_runs.record(Layout.of(settings), result)
    _print_result(result)
    if result.outcome is Outcome.FAILED:
        raise fail(result.error or "the run failed on " + ", ".join(
            t.target for t in result.tables if t.outcome is Outcome.FAILED), 1)


def register(app: typer.Typer, settings: Callable[[], Settings], fail: Callable[[str, int], typer.Exit]) -> None:
    """Add the job commands to the `lakebroker` app."""

    def topics(topic: str | None) -> None:
        from lakebroker.spark_pipeline.jobs.common import select_topics

        select_topics(Layout.of(settings()), topic)  # NotFound / InvalidName before Spark starts

    @app.command()
    def compact(topic: TopicArg = None) -> None:
        """Bin-pack small files into ordered files of compaction_target_file_bytes; checkpoint the log."""
        topics(topic)
        _run_job(settings(), "compaction", fail, topic=topic)

    @app.command()
    def retention(topic: TopicArg = None) -> None:
        """Apply retention_ms / retention_bytes, move lagging groups forward (recorded), VACUUM."""
        topics(topic)
        _run_job(settings(), "retention", fail, topic=topic)

    @app.command("key-compact")
    def key_compact(topic: TopicArg = None) -> None:
        """Keep the latest value per key of cleanup_policy=compact topics."""
        from lakebroker.spark_pipeline.jobs.key_compaction import compact_topics

        compact_topics(Layout.of(settings()), topic)
        _run_job(settings(), "key-compaction", fail, topic=topic)

    @app.command("compact-offsets")
    def compact_offsets() -> None:
        """Keep the latest committed offset per consumer group and partition."""
        _run_job(settings(), "offsets-compaction", fail)

    @app.command()
    def replicate(to: ToOption = None, topic: Annotated[str | None, typer.Option(help="Only this topic.")] = None,
                  ) -> None:
        """Copy every table incrementally to a second location (resumable, idempotent)."""
        from lakebroker.spark_pipeline.jobs.replication import resolve_replica

        resolve_replica(to or settings().replication_uri, settings().data_dir, settings().tables_uri)
        topics(topic)
        _run_job(settings(), "replication", fail, topic=topic, to=to)

    @app.command("verify-replica")
    def verify_replica(
        to: ToOption = None,
        topic: Annotated[str | None, typer.Option(help="Only this topic.")] = None,
        max_lag_messages: Annotated[int | None, typer.Option(min=0, help="Fail on more lag than this.")] = None,
    ) -> None:
        """Compare primary and replica (rows and offsets per partition); exit 1 on unexplained differences."""
        from lakebroker.job_progress import job_progress
        from lakebroker.spark_pipeline.jobs.replication import resolve_replica
        from lakebroker.spark_pipeline.jobs.verify_replica import verify
        from lakebroker.spark_pipeline.sql import cli_jvm_log, spark_for

        resolve_replica(to or settings().replication_uri, settings().data_dir, settings().tables_uri)
        topics(topic)
        spark = spark_for(settings(), "lakebroker-verify-replica", jvm_log=cli_jvm_log(settings(), "verify-replica"))
        try:
            with job_progress(out, "verify-replica", "rows compared") as progress:
                result = verify(spark, settings(), to, topic=topic, max_lag_messages=max_lag_messages,
                                progress=progress)
        finally:
            spark.stop()
        table = Table("topic", "partition", "primary offsets", "replica offsets", "lag (msgs)", "lag (s)",
                      "pending retention", "pending compaction", "missing", "unexpected")
        for c in result.partitions:
            table.add_row(c.topic, str(c.partition), f"{c.primary_range[0]}-{c.primary_range[1]}",
                          f"{c.replica_range[0]}-{c.replica_range[1]}", str(c.lag_messages),
                          "" if c.lag_seconds is None else f"{c.lag_seconds:.1f}", str(c.pending_retention),
                          str(c.pending_compaction), str(c.missing), str(c.unexpected))
        out.print(table)
        for entry in result.tables:
            out.print(" ".join(f"{k}={v}" for k, v in entry.items()), highlight=False)
        if not result.ok:
            raise fail("replica differs beyond lag and pending cleanup: " + "; ".join(result.problems), 1)
        out.print(f"replica OK: lag {result.lag_messages} messages", highlight=False)

    @app.command("job-runs")
    def job_runs_cmd(
        job: Annotated[JobName | None, typer.Option(help="Only this job.")] = None,
        topic: Annotated[str | None, typer.Option(help="Only this topic.")] = None,
        limit: Annotated[int, typer.Option(min=1, max=10_000)] = 20,
    ) -> None:
        """The last maintenance-job runs (from _system/job_runs), newest first."""
        from lakebroker.tables import job_runs

        rows = job_runs.last_runs(Layout.of(settings()), job=job, topic=topic, limit=limit)
        table = Table("started", "job", "table", "trigger", "outcome", "files", "rows removed", "seconds", "error")
        for r in rows:
            files = "" if r["files_before"] is None else f"{r['files_before']} → {r['files_after']}"
            table.add_row(r["started_at"].isoformat(timespec="seconds"), r["job"], r["target"], r["trigger"],
                          r["outcome"], files, "" if r["rows_removed"] is None else str(r["rows_removed"]),
                          f"{r['duration_ms'] / 1000:.1f}", r["error"] or "")
        out.print(table)
