"""The job commands' progress display, driven by the real jobs on the shared Spark session."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from lakebroker.job_progress import job_progress
from lakebroker.spark_pipeline.jobs import compaction, retention
from lakebroker.spark_pipeline.results import TableEvent
from tests.spark_fixtures import spark
from tests.spark_pipeline.topics import create_topic, produce, settings_for

__all__ = ["spark"]

pytestmark = [pytest.mark.spark]


def test_a_terminal_sees_the_jobs_own_progress_and_a_pipe_sees_none(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    for name in ("alpha", "beta"):
        create_topic(settings, name, partitions=1)
        for _ in range(3):
            produce(settings, name, 0, 5)

    events: list[TableEvent] = []
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, color_system=None, width=200)
    with job_progress(terminal, "compaction") as draw:
        assert draw is not None

        def seen(event: TableEvent) -> None:
            events.append(event)
            draw(event)

        result = compaction.run(spark, settings, progress=seen)
    targets = ["alpha", "beta", "_system/job_runs", "_system/retention_skips"]
    assert [(e.target, e.number, e.total, e.done) for e in events] == [
        (t, n, 4, done) for n, t in enumerate(targets, 1) for done in (False, True)]
    assert [(e.files, e.outcome) for e in events if e.done][:2] == [((3, 1), r.outcome) for r in result.tables[:2]]
    drawn = screen.getvalue()
    assert "compaction" in drawn and "0/4" in drawn and "2/4" in drawn and "4/4" in drawn
    assert "files 6 → 2" in drawn and "alpha" in drawn  # files summed over the tables done

    piped = io.StringIO()
    with job_progress(Console(file=piped, force_terminal=False), "retention", "rows removed") as draw:
        assert draw is None
        done = retention.run(spark, settings, progress=draw)
    assert len(done.tables) == 4 and piped.getvalue() == ""
