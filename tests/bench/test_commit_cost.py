"""bench.commit_cost runs end to end on a few versions: every cell is measured, and both tables,
committed through a handle opened once and through KeptTable, hold every row densely."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from bench import commit_cost
from lakebroker.tables import delta


def test_commit_cost_measures_both_handles(tmp_path: Path) -> None:
    points = commit_cost.measure([3, delta.RELOAD_AFTER_VERSIONS + 2], commits=1, work=tmp_path)
    assert [p.version for p in points] == [3, delta.RELOAD_AFTER_VERSIONS + 2]
    assert all(p.kept_open_ms > 0 and p.reloaded_ms > 0 for p in points)
    assert all(10 < p.rss_anon_mb < 24_000 for p in points)  # a real reading of this process
    for name in ("kept-open", "reloaded"):
        table = DeltaTable(str(tmp_path / name))
        assert table.version() == delta.RELOAD_AFTER_VERSIONS + 4  # created, then 2 commits per cell past the last
        rows = table.to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
        for p in range(commit_cost.PARTITIONS):
            offsets = sorted(r["offset"] for r in rows if r["partition"] == p)
            assert offsets == list(range(len(offsets))) and offsets, f"{name} partition {p}"
    assert "| table version |" in commit_cost.report(points, commits=1)
    assert "| process anon RSS, MB |" in commit_cost.report(points, commits=1)
