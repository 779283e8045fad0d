"""The replays state table (tables/replays.py): finished replays are kept KEEP_FINISHED, then left
out of every read and dropped at the table's next write."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from lakebroker.tables.layout import Layout
from lakebroker.tables.replays import ReplayPart, ReplayState, ReplayTable, new_replay_id


def _replay(table: ReplayTable, *, running: bool) -> str:
    replay_id = new_replay_id()
    end = 10 if running else 0  # an empty range is done at once
    table.create([ReplayPart(replay_id, "hooks", "orders", "t0", 0, None, None, None, start_offset=0,
                             end_offset=end, next_offset=0,
                             state=ReplayState.RUNNING if running else ReplayState.DONE)])
    return replay_id


def test_finished_replays_are_kept_their_time_then_left_out_and_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = ReplayTable(Layout(tmp_path))
    done, running = _replay(table, running=False), _replay(table, running=True)
    assert {r.parts[0].replay_id for r in table.replays("hooks")} == {done, running}

    monkeypatch.setattr("lakebroker.tables.replays.KEEP_FINISHED", timedelta(0))
    assert [r.parts[0].replay_id for r in table.replays("hooks")] == [running]  # left out of reads at once
    assert table.part(done, 0) is None
    assert {r["replay_id"] for r in table._table.read()} == {done, running}  # still in the table
    table.fail(running, "boom")  # any write: the finished replay's rows leave the table
    assert {r["replay_id"] for r in table._table.read()} == {running}


def test_a_chunk_recorded_twice_counts_once_even_on_a_cancelled_replay(tmp_path: Path) -> None:
    """Two holders across a lease hand-over (or a retried write) record the same chunk: the
    compare-and-set on next_offset lets one of them count, whether the replay runs or was cancelled."""
    table = ReplayTable(Layout(tmp_path))
    replay_id = _replay(table, running=True)
    part = table.part(replay_id, 0)
    assert part is not None
    assert table.advance(part, 0, 4, matched=3, delivered=3, failed=0) is True
    assert table.advance(part, 0, 4, matched=3, delivered=3, failed=0) is False
    table.cancel("hooks", replay_id)
    assert table.advance(part, 4, 8, matched=2, delivered=2, failed=0) is False  # cancelled: not running
    assert table.advance(part, 4, 8, matched=2, delivered=2, failed=0) is False
    [replay] = table.replays("hooks")
    assert (replay.state, replay.parts[0].matched, replay.parts[0].delivered, replay.parts[0].next_offset) == (
        ReplayState.CANCELLED, 5, 5, 8)
