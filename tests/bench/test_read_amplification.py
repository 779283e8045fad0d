"""bench.scenarios.read_amplification runs end to end on a small partition (its tiny mode: no Spark): the
one-row-group file is decoded whole for 1,000 rows, the bounded one only in the row groups that hold them,
and the Result's check, table and figures say so."""

from __future__ import annotations

from pathlib import Path

from bench.scenarios import read_amplification


def test_read_amplification_measures_both_files(tmp_path: Path) -> None:
    sizes = read_amplification.SIZES["tiny"]
    assert (sizes.rows, sizes.value_bytes, sizes.reads, sizes.spark) == (6_000, 2000, 2, False)  # 12 MB
    result = read_amplification.measure("tiny", tmp_path)
    assert result.scenario == read_amplification.SCENARIO.name == Path(read_amplification.__file__).stem
    one_group, bounded = result.figures["variants"]
    assert one_group["row_groups"] == 1 and one_group["rows_decoded"] == sizes.rows
    assert bounded["row_groups"] >= 3 and bounded["groups_read"] <= 2 and bounded["rows_decoded"] < sizes.rows / 2
    assert bounded["mb_read"] < one_group["mb_read"] / 2
    assert all(len(v["read_ms"]) == 2 and v["scan_ms"] > 0 for v in (one_group, bounded))
    assert (one_group["baseline"], bounded["baseline"]) == (None, one_group["name"])
    [check] = result.checks
    assert (check.value, check.target, check.higher_is_better, check.met) == (bounded["groups_read"], 2, False, True)
    [t] = result.tables
    assert t.head[:4] == ["file written by", "size", "row groups", "decoded by the read"]
    assert [row[:4] for row in t.rows] == [
        [one_group["name"], f"{one_group['file_mb']:.1f} MB", "1", f"1 row group(s), {sizes.rows:,} rows"],
        [bounded["name"], f"{bounded['file_mb']:.1f} MB", str(bounded["row_groups"]),
         f"{bounded['groups_read']} row group(s), {bounded['rows_decoded']:,} rows"]]
    assert "less than one row group" in t.rows[1][5] and "less than" not in t.rows[0][5]
    assert f"{bounded['rows_decoded']:,} rows" in result.notes[0] and len(result.headlines) == 1


def test_a_read_of_more_row_groups_fails_the_check() -> None:
    one = read_amplification.Variant("delta-rs, one row group", "", row_groups=1, groups_read=1, rows_decoded=300_000,
                                      read_ms=[60.0])
    bounded = read_amplification.Variant("delta-rs, row groups of 4 MiB", "", row_groups=19, groups_read=3,
                                         rows_decoded=48_000, read_ms=[20.0], baseline=one)
    [check] = read_amplification.result([one, bounded], read_amplification.SIZES["full"]).checks
    assert (check.value, check.met) == (3, False)
