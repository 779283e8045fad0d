"""The planners: pure functions of a snapshot's file list (no Spark)."""

from __future__ import annotations

import json

from lakebroker.spark_pipeline.plans import FileEntry, plan_bins, plan_log_start, plan_retention

HOUR_US = 3_600_000_000
NOW_US = 1_800_000_000_000_000


def f(name: str, lo: int, hi: int, size: int, newest_us: int = NOW_US, oldest_us: int | None = None,
      partition: int = 0) -> FileEntry:
    def iso(us: int) -> str:
        from datetime import UTC, datetime

        return datetime.fromtimestamp(us / 1e6, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    stats = {"numRecords": hi - lo + 1, "minValues": {"offset": lo, "timestamp": iso(oldest_us or newest_us)},
             "maxValues": {"offset": hi, "timestamp": iso(newest_us)}}
    return FileEntry.from_add(name, {"partition": str(partition)}, size, json.dumps(stats))


def test_bins_are_adjacent_runs_of_small_files_capped_at_the_target() -> None:
    files = [f("a", 0, 9, 10), f("b", 10, 19, 10), f("c", 20, 29, 10), f("big", 30, 99, 95),
             f("d", 100, 109, 10), f("e", 110, 119, 10), f("lone", 120, 129, 80)]
    bins = plan_bins(reversed(files), target_bytes=100, min_files=2, order_column="offset")
    assert [[x.path for x in b.files] for b in bins] == [["a", "b", "c"], ["d", "e"]]
    capped = plan_bins(files[:3], target_bytes=25, min_files=2, order_column="offset")
    assert [[x.path for x in b.files] for b in capped] == [["a", "b"]]  # "c" alone is not worth a rewrite


def test_bins_order_by_timestamps_too() -> None:
    early, late = f("early", 0, 0, 5, newest_us=NOW_US - HOUR_US), f("late", 0, 0, 5, newest_us=NOW_US)
    early = FileEntry(early.path, None, 5, 1, {"started_at": "2026-01-01T00:00:00.000Z"}, {})
    late = FileEntry(late.path, None, 5, 1, {"started_at": "2026-01-01T01:00:00.000Z"}, {})
    (b,) = plan_bins([late, early], target_bytes=100, min_files=2, order_column="started_at")
    assert [x.path for x in b.files] == ["early", "late"]


def test_time_retention_drops_a_prefix_of_expired_files() -> None:
    files = [f("old1", 0, 9, 10, NOW_US - 3 * HOUR_US), f("old2", 10, 19, 10, NOW_US - 2 * HOUR_US),
             f("new", 20, 29, 10, NOW_US), f("old3", 30, 39, 10, NOW_US - 3 * HOUR_US)]
    plan = plan_retention(0, files, now_us=NOW_US, retention_ms=3_600_000, retention_bytes=None, trim_partial=False)
    assert [x.path for x in plan.drop] == ["old1", "old2"]  # "old3" is behind a fresh file: no hole
    assert plan.log_start(40) == 20 and plan.reason == "time" and plan.trim is None
    everything = plan_retention(0, files[:2], now_us=NOW_US, retention_ms=3_600_000, retention_bytes=None,
                                trim_partial=False)
    assert everything.log_start(20) == 20  # an emptied partition starts at its log end


def test_size_retention_keeps_at_least_retention_bytes() -> None:
    files = [f(str(i), i * 10, i * 10 + 9, 100) for i in range(5)]
    plan = plan_retention(0, files, now_us=NOW_US, retention_ms=None, retention_bytes=250, trim_partial=False)
    assert [x.path for x in plan.drop] == ["0", "1"]  # 300 bytes stay; dropping another would leave 200
    assert plan.reason == "size"


def test_trim_only_the_straddling_file_and_only_when_asked() -> None:
    files = [f("old", 0, 9, 10, NOW_US - 3 * HOUR_US),
             f("straddle", 10, 19, 10, NOW_US, oldest_us=NOW_US - 3 * HOUR_US)]
    off = plan_retention(0, files, now_us=NOW_US, retention_ms=3_600_000, retention_bytes=None, trim_partial=False)
    on = plan_retention(0, files, now_us=NOW_US, retention_ms=3_600_000, retention_bytes=None, trim_partial=True)
    assert off.trim is None and on.trim is not None and on.trim.path == "straddle"


def test_stats_truncated_to_milliseconds_never_drop_a_fresh_row() -> None:
    now = NOW_US + 500  # the cutoff falls 500 µs into a millisecond
    # The statistic says 500 µs before the cutoff, but it is truncated: the true newest row may be
    # up to 999 µs later, past the cutoff. Keep the file.
    edge = f("edge", 0, 9, 10, newest_us=NOW_US - HOUR_US)
    plan = plan_retention(0, [edge], now_us=now, retention_ms=3_600_000, retention_bytes=None, trim_partial=False)
    assert plan.drop == ()
    later = plan_retention(0, [edge], now_us=now + 1000, retention_ms=3_600_000, retention_bytes=None,
                           trim_partial=False)
    assert [x.path for x in later.drop] == ["edge"]


def test_replica_follows_a_log_start() -> None:
    files = [f("a", 0, 9, 10), f("b", 10, 19, 10), f("c", 20, 29, 10)]
    plan = plan_log_start(0, files, 15)
    assert [x.path for x in plan.drop] == ["a"] and plan.trim is not None and plan.trim.path == "b"
