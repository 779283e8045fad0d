"""A maintenance-job run as it goes: its progress events and the runner that times each table.
What a run did is a `JobResult` (tables/job_runs.py)."""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from lakebroker.tables.job_runs import JobName, JobResult, Outcome, TableResult

log = logging.getLogger(__name__)


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:1000]


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
