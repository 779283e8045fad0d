"""One run of each scheduled job per interval, however many schedulers share the tables.

Every `lakebroker serve` of a cluster schedules the maintenance jobs. Before a run, its scheduler
takes the job's slot in `_system/job_slots` (a state table changed by compare-and-swap on its
version): only if no run of the job holds a live lease and none started within most of an
interval. The scheduler renews its lease while the run goes on and ends it when the run does, so a
scheduler that dies mid-run holds the job for one lease at most.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from lakebroker.tables.job_runs import JobName
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import JOB_SLOTS_SCHEMA, JOB_SLOTS_SCHEMA_VERSION
from lakebroker.tables.state_table import Rows, StateTable

# A run that started within this share of an interval counts as the interval's: schedulers that
# started a little apart do not each run the job once.
RECENT_SHARE = 0.9


def this_runner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class JobSlots:
    def __init__(
        self, layout: Layout, runner: str | None = None, clock: Callable[[], datetime] | None = None
    ) -> None:
        self.table = StateTable(layout.job_slots_table, JOB_SLOTS_SCHEMA, JOB_SLOTS_SCHEMA_VERSION)
        self.runner = runner or this_runner()
        self._now = clock or (lambda: datetime.now(UTC))

    def take(self, job: JobName, *, interval_s: float, lease_s: float) -> str | None:
        """Take the job's slot for a run of this runner's. None once taken; else why another runner
        has it, for the log."""

        def change(rows: Rows) -> tuple[Rows, str | None]:
            now = self._now()
            out = [dict(r) for r in rows]
            row = next((r for r in out if r["job"] == job.value), None)
            if row is not None and row["runner"] != self.runner:  # this runner's own turns are its schedule's
                if row["expires_at"] > now:
                    return rows, f"running on {row['runner']} since {row['started_at']:%H:%M:%S}"
                if row["started_at"] > now - timedelta(seconds=interval_s * RECENT_SHARE):
                    return rows, f"last started by {row['runner']} at {row['started_at']:%H:%M:%S}"
            if row is None:
                row = {"job": job.value}
                out.append(row)
            row.update(runner=self.runner, started_at=now, expires_at=now + timedelta(seconds=lease_s))
            return sorted(out, key=lambda r: r["job"]), None

        return self.table.mutate(change)

    def renew(self, job: JobName, lease_s: float) -> None:
        """Extend this runner's lease of the job while its run goes on."""
        self._set_expiry(job, lambda now: now + timedelta(seconds=lease_s))

    def finish(self, job: JobName) -> None:
        """End this runner's lease of the job (its run is over): the next interval's may run anywhere."""
        self._set_expiry(job, lambda now: now)

    def _set_expiry(self, job: JobName, expiry: Callable[[datetime], datetime]) -> None:
        def change(rows: Rows) -> tuple[Rows, None]:
            now = self._now()
            out = [dict(r) for r in rows]
            for r in out:
                if r["job"] == job.value and r["runner"] == self.runner and r["expires_at"] > now:
                    r["expires_at"] = expiry(now)
            return out, None

        self.table.mutate(change)
