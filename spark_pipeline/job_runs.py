"""The durable record of maintenance jobs: `_system/job_runs`.

Written and read with delta-rs only (no pyspark import), so the API, the dashboard, the
scheduler and Prometheus can all read it from the ingest process:

* `record(layout, result)` appends one row per table a run touched (or one row for a run that
  failed before touching any), in one commit;
* `last_runs(layout, ...)` returns the newest runs, newest first, for the dashboard.

The skips retention makes when it moves a consumer group past messages it had not delivered
have their own table, `_system/retention_skips` (tables/retention_skips.py). They are never
silent: each is a row there, an `OffsetReason.RETENTION_SKIP` row in the offsets table, a metric
(spark_pipeline/metrics.py), and part of the subscription's status.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from lakebroker.spark_pipeline.results import JobResult, Outcome
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import JOB_RUNS_SCHEMA, JOB_RUNS_SCHEMA_VERSION


def record(layout: Layout, result: JobResult) -> None:
    rows: list[dict[str, Any]] = []
    for t in result.tables:
        rows.append({
            "run_id": result.run_id, "job": result.job.value, "target": t.target, "topic": t.topic,
            "trigger": result.trigger, "started_at": result.started_at, "duration_ms": t.duration_ms,
            "outcome": t.outcome.value, "files_before": t.files_before, "files_after": t.files_after,
            "rows_removed": t.rows_removed, "bytes_before": t.bytes_before, "bytes_after": t.bytes_after,
            "error": t.error, "details": json.dumps(t.details, default=str) if t.details else None,
        })
    if result.error is not None or not rows:
        rows.append({
            "run_id": result.run_id, "job": result.job.value, "target": "", "topic": None,
            "trigger": result.trigger, "started_at": result.started_at, "duration_ms": result.duration_ms,
            "outcome": (Outcome.FAILED if result.error else result.outcome).value, "files_before": None,
            "files_after": None, "rows_removed": None, "bytes_before": None, "bytes_after": None,
            "error": result.error, "details": None,
        })
    table = delta.ensure_table(layout.job_runs_table, JOB_RUNS_SCHEMA, partition_by=None,
                               version=JOB_RUNS_SCHEMA_VERSION)
    delta.append(table, pa.Table.from_pylist(rows, schema=JOB_RUNS_SCHEMA),
                 metadata={"lakebroker.operation": f"job-run-{result.job.value}"})


def last_runs(layout: Layout, *, job: str | None = None, topic: str | None = None, limit: int = 50,
              since: datetime | None = None) -> list[dict[str, Any]]:
    """The newest job_runs rows (one per run and table), newest first."""
    table = delta.open_table(layout.job_runs_table)
    if table is None:
        return []
    flt = delta.matching({"job": job, "topic": topic}, ("started_at", since))
    rows = delta.read_rows(table, flt).sort_by([("started_at", "descending"), ("target", "ascending")])
    out: list[dict[str, Any]] = rows.slice(0, limit).to_pylist()
    for row in out:
        row["details"] = json.loads(row["details"]) if row["details"] else {}
    return out


def horizon(days: int) -> datetime:
    return datetime.now(UTC) - timedelta(days=days)
