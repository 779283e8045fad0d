"""The job_runs recorder and reader, retention skips, and their Prometheus metrics (no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from lakebroker.spark_pipeline.metrics import JobMetricsCollector
from lakebroker.spark_pipeline.results import Run
from lakebroker.tables import job_runs
from lakebroker.tables.job_runs import JobName, Outcome, TableResult
from lakebroker.tables.layout import Layout
from lakebroker.tables.retention_skips import RetentionSkip, record_skips, retention_skips


def _run(job: JobName, outcome: Outcome = Outcome.OK) -> Run:
    run = Run(job, trigger="scheduler")

    def work(r: TableResult) -> None:
        r.files_before, r.files_after, r.rows_removed = 10, 2, 7
        r.details["bins"] = 3
        if outcome is Outcome.FAILED:
            raise RuntimeError("disk on fire\nsecond line")

    run.table("orders", "orders", work)
    return run


def test_record_and_read_runs(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    job_runs.record(layout, _run(JobName.COMPACTION).finish())
    failed = _run(JobName.RETENTION, Outcome.FAILED).finish()
    assert failed.outcome is Outcome.FAILED and failed.tables[0].error == "RuntimeError: disk on fire"
    job_runs.record(layout, failed)
    rows = job_runs.last_runs(layout)
    assert [r["job"] for r in rows] == ["retention", "compaction"]  # newest first
    assert rows[1]["files_before"] == 10 and rows[1]["files_after"] == 2 and rows[1]["details"] == {"bins": 3}
    assert rows[0]["outcome"] == "failed" and rows[0]["error"] == "RuntimeError: disk on fire"
    assert job_runs.last_runs(layout, job="compaction", topic="orders")[0]["rows_removed"] == 7
    # A run that failed before touching a table is still one row.
    empty = Run(JobName.REPLICATION).finish()
    empty.error = "bad replica"
    job_runs.record(layout, empty)
    assert job_runs.last_runs(layout, job="replication")[0]["error"] == "bad replica"


def test_skips_are_durable_deduplicated_and_exported(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    at = datetime.now(UTC)
    skip = RetentionSkip("billing", "orders", 1, 5, 30, at, "run1")
    record_skips(layout, [skip])
    redo = RetentionSkip("billing", "orders", 1, 5, 30, at + timedelta(seconds=1), "run2")
    record_skips(layout, [redo])  # a run that crashed before moving the group, redone
    record_skips(layout, [RetentionSkip("other", "orders", 0, 0, 3, at, "run3")])
    found = retention_skips(layout, group="billing")
    assert [(s.partition, s.skipped_messages, s.run_id) for s in found] == [(1, 25, "run1")]
    assert retention_skips(layout, since=at + timedelta(seconds=2)) == []
    job_runs.record(layout, _run(JobName.COMPACTION).finish())
    registry = CollectorRegistry()
    registry.register(JobMetricsCollector(layout))
    text = generate_latest(registry).decode()
    assert 'lakebroker_retention_skipped_messages_total{group="billing",topic="orders"} 25.0' in text
    assert 'lakebroker_retention_skips_total{group="other",topic="orders"} 1.0' in text
    assert 'lakebroker_job_last_run_timestamp_seconds{job="compaction",outcome="ok"}' in text
    assert 'lakebroker_job_rows_removed{job="compaction",topic="orders"} 7.0' in text
