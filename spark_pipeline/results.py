"""What a maintenance-job run did, per table: the value every job returns and job_runs records."""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

log = logging.getLogger(__name__)


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


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:1000]


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


@dataclass(frozen=True)
class TableEvent:
    """A run's progress, reported as it goes: a table started (`done` False) or finished."""

    target: str
    number: int  # 1-based position of this table in the run
    total: int  # tables the run visits
    done: bool = False
    outcome: Outcome | None = None
    files: tuple[int | None, int | None] | None = None  # data files before and after
    rows: int | None = None  # the job's own count: removed, copied or compared


Progress = Callable[[TableEvent], None]


class Run:
    """Times a job run and each table it touches; a table's failure is recorded, not raised,
    so one bad topic does not stop the others. `progress` hears of each table as it starts and
    ends; `rows` picks the row count it is told (default: rows removed)."""

    def __init__(self, job: JobName, trigger: str = "library", *, progress: Progress | None = None,
                 rows: Callable[[TableResult], int | None] = lambda t: t.rows_removed) -> None:
        self.result = JobResult(job=job, run_id=uuid.uuid4().hex, trigger=trigger, started_at=datetime.now(UTC))
        self._t0 = time.perf_counter()
        self._progress = progress
        self._rows = rows
        self.total = 0

    def expect(self, tables: int) -> None:
        """How many tables this run will visit, for its progress reports."""
        self.total = tables

    def table(self, target: str, topic: str | None, work: Callable[[TableResult], None]) -> TableResult:
        entry = TableResult(target=target, topic=topic)
        number = len(self.result.tables) + 1
        total = max(self.total, number)
        if self._progress is not None:
            self._progress(TableEvent(target, number, total))
        t0 = time.perf_counter()
        try:
            work(entry)
        except Exception as exc:  # noqa: BLE001 - recorded in job_runs; the other tables still run
            log.error("%s of %s failed:\n%s", self.result.job.value, target, traceback.format_exc())
            entry.outcome = Outcome.FAILED
            entry.error = one_line(exc)
        entry.duration_ms = int((time.perf_counter() - t0) * 1000)
        self.result.tables.append(entry)
        if self._progress is not None:
            self._progress(TableEvent(target, number, total, done=True, outcome=entry.outcome,
                                      files=(entry.files_before, entry.files_after), rows=self._rows(entry)))
        return entry

    def finish(self) -> JobResult:
        self.result.duration_ms = int((time.perf_counter() - self._t0) * 1000)
        return self.result
