"""The durable record of maintenance jobs: `_system/job_runs`, and what a run did per table
(`JobResult`, `TableResult`): the value every job returns and this table records.

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
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import pyarrow as pa

from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import JOB_RUNS_SCHEMA, JOB_RUNS_SCHEMA_VERSION


class JobName(StrEnum):
    COMPACTION = "compaction"
    RETENTION = "retention"
    KEY_COMPACTION = "key-compaction"
    OFFSETS_COMPACTION = "offsets-compaction"
    REPLICATION = "replication"


class Outcome(StrEnum):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"  # nothing to do (no table yet, or not this job's kind of topic)


@dataclass
class TableResult:
    target: str  # topic name, or "_system/<table>"
    topic: str | None
    outcome: Outcome = Outcome.OK
    files_before: int | None = None
    files_after: int | None = None
    rows_removed: int | None = None
    bytes_before: int | None = None
    bytes_after: int | None = None
    duration_ms: int = 0
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        out["outcome"] = self.outcome.value
        return out


@dataclass
class JobResult:
    job: JobName
    run_id: str
    trigger: str
    started_at: datetime
    duration_ms: int = 0
    tables: list[TableResult] = field(default_factory=list)
    error: str | None = None  # a failure of the run as a whole (before or beside any table)

    @property
    def outcome(self) -> Outcome:
        if self.error or any(t.outcome is Outcome.FAILED for t in self.tables):
            return Outcome.FAILED
        if self.tables and all(t.outcome is Outcome.SKIPPED for t in self.tables):
            return Outcome.SKIPPED
        return Outcome.OK

    def total(self, name: str) -> int:
        return sum(getattr(t, name) or 0 for t in self.tables)

    def table(self, target: str) -> TableResult:
        return next(t for t in self.tables if t.target == target)

    def public(self) -> dict[str, Any]:
        return {"job": self.job.value, "run_id": self.run_id, "trigger": self.trigger,
                "started_at": self.started_at.isoformat(), "duration_ms": self.duration_ms,
                "outcome": self.outcome.value, "error": self.error, "tables": [t.public() for t in self.tables]}



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
