"""bench.scenarios.spark_jobs reads its figures into a Result: retention's checks judge the DELETE commit's
metrics (whole files dropped, nothing rewritten), the query's check the files its scan opened against
those holding the range; the full run is the biggest. No Spark: the figures are given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bench.result import Result
from bench.scenarios import spark_jobs


def figures(*, added: str = "0", copied: str = "0", trimmed: int = 0,
            files_read: int = 1) -> tuple[dict[str, Any], ...]:
    comp = {"build_s": 78.0, "seconds": 28.7, "rows": 5_000_000, "files_before": 1000, "files_after": 1,
            "bytes_before": 89_300_000, "bytes_after": 55_100_000, "bins": 1, "commits": 1}
    ret = {"build_s": 12.0, "seconds": 4.8, "rows": 10_000_000, "files_before": 240, "partitions": 3,
           "files_after": 120, "rows_removed": 4_999_920, "files_dropped_whole": 120, "files_rewritten": trimmed,
           "commit_metrics": {"numRemovedFiles": "120", "numAddedFiles": added, "numCopiedRows": copied},
           "vacuum_hours": 168.0}
    query = {"query": "SELECT offset FROM retention_bench WHERE partition = 1 AND offset BETWEEN 10 AND 1009",
             "seconds": 2.81, "files_read": files_read, "bytes_read": 460_000, "rows": 1000,
             "files_holding_range": 1, "files_in_partition": 40, "files_in_table": 120,
             "scan": "+- FileScan parquet ... PartitionFilters: [(partition#1 = 1)]"}
    return comp, ret, query


def checks(result: Result) -> dict[str, tuple[float, float, bool]]:
    return {c.name: (c.value, c.target, c.met) for c in result.checks}


def test_whole_file_drops_and_a_pruned_scan_meet_every_check() -> None:
    comp, ret, query = figures()
    result = spark_jobs.result(comp, ret, query)
    assert result.scenario == spark_jobs.SCENARIO.name == Path(spark_jobs.__file__).stem
    assert checks(result) == {"retention: files rewritten": (0, 0, True), "retention: rows copied": (0, 0, True),
                              "query: files its scan opened": (1, 1, True)}
    [t] = result.tables
    assert [row[0] for row in t.rows] == ["compaction of one partition", "retention (older half expired)",
                                          "analyst query, one partition's offset range"]
    assert t.rows[0][2] == "28.7 s" and "1,000 → 1 files (55.1 MB)" in t.rows[0][3] and "174,216 rows/s" in t.rows[0][3]
    assert "120 files dropped whole, 0 rewritten" in t.rows[1][3] and "3 partitions" in t.rows[1][1]
    assert "**1 file(s)** of 40 in the partition and 120 in the table" in t.rows[2][3]
    assert "whole files dropped without any rewrite" in result.notes[0] and "4.8 s" in result.notes[0]
    assert query["scan"] in result.notes[1]
    assert result.figures == {"compaction": comp, "retention": ret, "query": query}
    assert Result.from_json(result.to_json()).figures == orjson.loads(orjson.dumps(result.figures))


def test_a_rewrite_or_an_unpruned_scan_fails_its_check() -> None:
    result = spark_jobs.result(*figures(added="1", copied="2500", trimmed=1, files_read=40))
    assert checks(result) == {"retention: files rewritten": (2, 0, False), "retention: rows copied": (2500, 0, False),
                              "query: files its scan opened": (40, 1, False)}
    assert "some rows were rewritten" in result.notes[0] and "reads and writes no data file" not in result.notes[0]


def test_the_full_run_is_the_largest() -> None:
    full, quick, tiny = (spark_jobs.SIZES[m] for m in ("full", "quick", "tiny"))
    assert full.compaction_rows > quick.compaction_rows > tiny.compaction_rows
    assert full.retention_rows > quick.retention_rows > tiny.retention_rows
    for sizes in (full, quick, tiny):  # whole files per partition, each at least as long as the query's range
        assert sizes.retention_files % sizes.retention_partitions == 0
        assert sizes.retention_rows // sizes.retention_files > spark_jobs.QUERY_OFFSETS
