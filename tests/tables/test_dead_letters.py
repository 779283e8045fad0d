"""Dead letters: replay requests as a delivery worker polls for them (every second)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakebroker.tables import delta
from lakebroker.tables.dead_letters import DeadLetter, DeadLetterTable
from lakebroker.tables.layout import Layout


def _letters(group: str, partition: int, offsets: range) -> list[DeadLetter]:
    return [DeadLetter.from_exhausted_retries(group, "orders", partition, o, 5, 500, "boom") for o in offsets]


def test_replay_requests_are_read_once_per_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(tmp_path)
    worker, operator = DeadLetterTable(layout), DeadLetterTable(layout)  # two processes, in effect
    assert worker.pending_replays_all({"g"}) == {}  # no table yet
    operator.add(_letters("g", 0, range(3)) + _letters("g", 1, range(10, 12)) + _letters("other", 0, range(1)))
    assert worker.pending_replays_all({"g"}) == {}  # dead, but nobody asked for a replay

    assert operator.request_replay("g", partition=0, from_offset=1) == 2
    assert worker.pending_replays_all({"g", "other"}) == {("g", 0): [1, 2]}

    reads: list[str] = []
    original = delta.read_rows
    monkeypatch.setattr(delta, "read_rows", lambda *a, **k: reads.append("read") or original(*a, **k))
    for _ in range(5):  # no commit since: the answer is the one already read, from a stat
        assert worker.pending_replays_all({"g", "other"}) == {("g", 0): [1, 2]}
    assert reads == []
    assert worker.pending_replays_all({"g"}) == {("g", 0): [1, 2]}  # other groups: read again
    assert reads == ["read"]

    operator.mark_replayed("g", 0, [1])  # a commit (here by another process) changes the answer
    operator.request_replay("g", partition=1)
    assert worker.pending_replays_all({"g"}) == {("g", 0): [2], ("g", 1): [10, 11]}
    assert len(reads) == 2


def test_letters_of_several_groups_stay_readable_after_a_replay_request(tmp_path: Path) -> None:
    """A replay request rewrites a file holding several groups' letters (delta-rs's UPDATE), and
    the file's new statistics once made every filtered read of the table fail."""
    table = DeadLetterTable(Layout(tmp_path))
    table.add(_letters("g", 0, range(3)) + _letters("other", 0, range(2)))
    assert table.request_replay("g", partition=0) == 3
    assert [r["offset"] for r in table.letters("g")] == [0, 1, 2]
    assert table.count("other") == 2
    assert table.pending_replays_all({"g", "other"}) == {("g", 0): [0, 1, 2]}
    assert sorted(table.unreplayed()) == ["g", "other"]
