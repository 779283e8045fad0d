"""The position tracker (delivery_worker/position.py): pure bookkeeping, tested without asyncio."""

from __future__ import annotations

import random

from lakebroker.delivery_worker.position import PositionTracker


def test_the_position_moves_only_over_a_run_of_done_offsets() -> None:
    t = PositionTracker(10)
    t.done([12, 13])  # acknowledged before 10 and 11
    assert t.position == 10 and t.to_commit() is None
    t.done([10])
    assert t.position == 11
    t.done([11])
    assert t.position == 14 and t.to_commit() == 14
    t.done([])  # nothing new: nothing moves
    assert t.position == 14


def test_a_commit_is_asked_for_once_and_an_older_commit_never_moves_it_back() -> None:
    t = PositionTracker(0)
    t.done(range(5))
    assert t.to_commit() == 5
    t.was_committed(5)
    assert t.to_commit() is None and t.committed == 5
    t.was_committed(3)  # a commit that finished late
    assert t.committed == 5


def test_a_jump_forgets_what_was_done_past_the_old_position() -> None:
    t = PositionTracker(0)
    t.done([2, 3])
    t.jump(100)  # retention removed 0-99: committed with its reason
    assert (t.position, t.committed, t.to_commit()) == (100, 100, None)
    t.done([101])
    assert t.position == 100  # 2 and 3 were forgotten, 100 is not done yet
    t.done([100])
    assert t.position == 102


def test_done_in_any_order_ends_where_every_offset_is_done() -> None:
    rng = random.Random(7)
    offsets = list(range(50, 1050))
    rng.shuffle(offsets)
    t = PositionTracker(50)
    highest_run = 50
    seen: set[int] = set()
    for chunk in range(0, len(offsets), 37):
        part = offsets[chunk:chunk + 37]
        t.done(part)
        seen.update(part)
        while highest_run in seen:
            highest_run += 1
        assert t.position == highest_run
    assert t.position == 1050
