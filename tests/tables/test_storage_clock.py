"""A node's clock against the table storage's: the bounds one probe allows, and when they say the
clock is surely off."""

from __future__ import annotations

from pathlib import Path

from lakebroker.tables.storage_clock import Skew, max_skew_s, skew


def test_a_probe_on_local_storage_brackets_no_skew(tmp_path: Path) -> None:
    measured = skew(str(tmp_path / "_system"), "node-a")
    assert measured.low <= 0.05 and measured.high >= -0.05, measured  # the same kernel clock, to its tick
    assert not measured.beyond(max_skew_s(8))
    assert (tmp_path / "_system" / "clocks" / "node-a").is_file()


def test_a_clock_is_off_only_when_every_instant_of_the_write_says_so() -> None:
    bound = max_skew_s(8)
    assert bound == 2
    assert Skew(2.5, 2.6).beyond(bound) and Skew(-3.0, -2.1).beyond(bound)
    assert not Skew(1.0, 2.5).beyond(bound), "the write may have happened 1 s off: not surely beyond"
    assert not Skew(-2.5, 0.5).beyond(bound)
