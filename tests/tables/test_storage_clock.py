"""A node's clock against the table storage's: the bounds one probe allows, and when they say the
clock is surely off."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lakebroker.tables import storage_clock
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


@pytest.mark.parametrize("offset_s", [0.0, 1.6, -1.6])
def test_a_probe_on_s3_tells_a_clock_off_by_more_than_a_short_ttls_bound(
        s3_root: str, monkeypatch: pytest.MonkeyPatch, offset_s: float) -> None:
    """S3 gives an object's time in whole seconds, so one probe brackets the skew within a second
    or more: with a 4 s lease TTL (a bound of 1 s) no probe could tell, and a node whose clock ran
    8 s off took partitions on S3 (the cluster soak on the local S3 server). Probes at several
    phases of the second narrow the bracket to what the bound needs."""
    real = time.time
    monkeypatch.setattr(storage_clock.time, "time", lambda: real() + offset_s)
    measured = skew(f"{s3_root}/_system", "node-a")
    bound = max_skew_s(4)
    assert measured.high - measured.low < bound, f"precise enough for a 1 s bound: {measured}"
    assert measured.low - 0.3 <= offset_s <= measured.high + 0.3, f"brackets the offset: {measured}"
    assert measured.beyond(bound) == (abs(offset_s) > bound)
