"""Scheduled jobs run once per interval however many `serve` processes share the tables."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from lakebroker.spark_pipeline.scheduler import JobRunner
from lakebroker.tables import job_runs
from lakebroker.tables.job_runs import JobName
from lakebroker.tables.job_slots import JobSlots
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings

HOUR = 3600.0


def test_one_runner_at_a_time_and_once_per_interval(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    a, b = JobSlots(layout, "a"), JobSlots(layout, "b")
    assert a.take(JobName.COMPACTION, interval_s=HOUR, lease_s=60) is None
    assert "running on a" in (b.take(JobName.COMPACTION, interval_s=HOUR, lease_s=60) or "")
    assert b.take(JobName.RETENTION, interval_s=HOUR, lease_s=60) is None, "another job is free"
    a.finish(JobName.COMPACTION)
    assert "last started by a" in (b.take(JobName.COMPACTION, interval_s=HOUR, lease_s=60) or ""), \
        "a ran it this interval"
    assert b.take(JobName.COMPACTION, interval_s=0.01, lease_s=60) is None, "a new interval: anyone's"
    assert a.take(JobName.COMPACTION, interval_s=0.01, lease_s=60) is not None, "b runs it now"


def test_a_dead_runners_lease_ends_unless_renewed(tmp_path: Path) -> None:
    # One clock for every runner, moved by hand: the leases end when the test says, however slow
    # the commits are on a loaded machine.
    now = [datetime(2026, 1, 1, tzinfo=UTC)]

    def slots(runner: str) -> JobSlots:
        return JobSlots(layout, runner, clock=lambda: now[0])

    def wait(seconds: float) -> None:
        now[0] += timedelta(seconds=seconds)

    layout = Layout(tmp_path)
    assert slots("dead").take(JobName.COMPACTION, interval_s=0.01, lease_s=0.2) is None
    live = slots("live")
    assert live.take(JobName.COMPACTION, interval_s=0.01, lease_s=60) is not None
    wait(0.3)
    assert live.take(JobName.COMPACTION, interval_s=0.01, lease_s=0.2) is None
    live.renew(JobName.COMPACTION, 60)
    wait(0.3)
    assert "running on live" in (slots("other").take(JobName.COMPACTION, interval_s=0.01, lease_s=60) or "")
    wait(60)
    assert slots("other").take(JobName.COMPACTION, interval_s=0.01, lease_s=60) is None, "the renewed lease ends"


def test_a_runner_taking_its_own_slot_again_keeps_one_row(tmp_path: Path) -> None:
    slots = JobSlots(Layout(tmp_path))
    for _ in range(3):
        assert slots.take(JobName.RETENTION, interval_s=HOUR, lease_s=60) is None
        slots.finish(JobName.RETENTION)
    assert [r["job"] for r in slots.table.read()] == ["retention"]


def test_runners_racing_for_one_slot_get_it_once(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    JobSlots(layout, "init").table.read()
    results: dict[str, str | None] = {}
    start = threading.Barrier(4)

    def race(name: str) -> None:
        slots = JobSlots(layout, name)
        start.wait()
        results[name] = slots.take(JobName.RETENTION, interval_s=HOUR, lease_s=60)

    threads = [threading.Thread(target=race, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r is None for r in results.values()) == [False, False, False, True], results


def test_a_scheduler_whose_job_ran_elsewhere_starts_no_child(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    layout = Layout.of(settings)
    assert JobSlots(layout, "other-node").take(JobName.COMPACTION, interval_s=HOUR, lease_s=60) is None
    runner = JobRunner(settings)
    assert runner.run(JobName.COMPACTION) is None
    assert not (settings.data_dir / "_jobs" / "compaction.log").exists(), "no child was started"
    assert job_runs.last_runs(layout) == []
