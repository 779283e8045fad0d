"""bench.read_amplification runs end to end on a small partition: the one-row-group file is decoded
whole for 1,000 rows, the bounded one only in the row groups that hold them."""

from __future__ import annotations

from pathlib import Path

from bench import read_amplification


def test_read_amplification_measures_both_files(tmp_path: Path) -> None:
    rows = 6_000  # of 2 KB values: 12 MB, three row groups when bounded
    one_group, bounded = read_amplification.measure(rows, 2000, reads=2, work=tmp_path)
    assert one_group.row_groups == 1 and one_group.rows_decoded == rows
    assert bounded.row_groups >= 3 and bounded.groups_read <= 2 and bounded.rows_decoded < rows / 2
    assert bounded.mb_read < one_group.mb_read / 2
    assert all(len(v.read_ms or []) == 2 and v.scan_ms > 0 for v in (one_group, bounded))
    assert "| file written by |" in read_amplification.report([one_group, bounded], rows, 2000, 2)
