"""bench.dedup_memory's serve scenario, briefly: wrk's ids reach serve's index, a restart rebuilds
it, and the report's memory row reads its peaks."""

from __future__ import annotations

from bench.dedup_memory import SERVE_PEAKS_MARK, serve_full_index
from bench.plan import PLANS
from bench.report import Results, _dedup_peaks, _memory_row


def test_serve_sent_ids_by_wrk_answers_a_retry_after_a_restart() -> None:
    serve = serve_full_index(1, chunk_s=2)
    assert serve["errors"] == 0 and serve["ids_sent"] >= 1_000
    assert serve["retry_duplicate"] is True
    assert 0 < serve["idle_mb"] <= serve["full_peak_mb"] and serve["restart_peak_mb"] > 0
    assert serve["ring_mb"] > 0


def test_the_memory_row_counts_the_dedup_peaks_of_this_run_only() -> None:
    fragment = f"text\n<!-- {SERVE_PEAKS_MARK} full-index=250.5 restart=310.0 -->\n"
    results = Results(plan=PLANS["tiny"], machine=None, work_label="", command="")  # type: ignore[arg-type]
    results.fragments = [("Dedup index", fragment)]
    assert _dedup_peaks(results) == [("a full dedup index", 250.5), ("its restart's rebuild", 310.0)]
    row = _memory_row(results)
    assert row is not None and "its restart's rebuild 310 MB" in row[1] and "not met" in row[4].lower()
    results.fragments = [("Dedup index", "_from `docs/benchmarks-dedup.md` written earlier_\n\n" + fragment)]
    assert _dedup_peaks(results) == [] and _memory_row(results) is None
