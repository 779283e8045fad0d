"""bench.scenarios.dedup_memory's serve scenario, briefly: wrk's ids reach serve's index, a restart rebuilds
it, and the Result judges both of serve's peaks against the ingest memory target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.result import Result
from bench.scenarios.dedup_memory import TARGET_SERVE_RSS_MB, report, serve_full_index

INDEXES = {kind: {"rss_mb": mb, "peak_mb": mb, "fill_us": 1.0, "hit_us": 0.5, "new_us": 1.5}
           for kind, mb in (("compact", 23.0), ("tuples", 787.0))}


def _serve(full_peak_mb: float, restart_peak_mb: float) -> dict[str, Any]:
    return {"ids_sent": 2_468_000, "errors": 0, "fill_s": 40.0, "idle_mb": 185.0, "full_rss_mb": 246.0,
            "full_peak_mb": full_peak_mb, "ring_mb": 76.0, "restart_ready_s": 13.7, "restart_rss_mb": 260.0,
            "restart_peak_mb": restart_peak_mb, "retry_duplicate": True}


def test_serve_sent_ids_by_wrk_answers_a_retry_after_a_restart(tmp_path: Path) -> None:
    serve = serve_full_index(1, tmp_path, chunk_s=2)
    assert serve["errors"] == 0 and serve["ids_sent"] >= 1_000
    assert serve["retry_duplicate"] is True
    assert 0 < serve["idle_mb"] <= serve["full_peak_mb"] and serve["restart_peak_mb"] > 0
    assert serve["ring_mb"] > 0
    checks = report(2_000, INDEXES, serve).checks
    assert [c.value for c in checks] == [serve["full_peak_mb"], serve["restart_peak_mb"]]


def test_the_checks_judge_this_runs_serve_peaks_against_the_memory_target() -> None:
    result = Result.from_json(report(2_000_000, INDEXES, _serve(250.5, 310.0)).to_json())  # as report.py reads it
    full, restart = result.checks
    assert (full.name, full.value, full.unit) == ("serve's peak RSS, full dedup index", 250.5, "MB")
    assert (restart.name, restart.value) == ("serve's peak RSS, restart rebuilding the index", 310.0)
    assert TARGET_SERVE_RSS_MB == 300
    for check in (full, restart):
        assert check.target == TARGET_SERVE_RSS_MB and not check.higher_is_better
    assert full.met and not restart.met
    assert result.figures["serve"]["restart_peak_mb"] == 310.0
    serve_table = result.tables[1]
    assert serve_table.rows[2][2] == "310 MB" and "more than it keeps" in serve_table.caption
    assert result.tables[0].rows[0][1] == "23 (12)"  # MB (B per id) of the compact index
