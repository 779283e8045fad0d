"""The soak (bench/soak.py): its short form end to end, and how its report joins docs/benchmarks.md.

The short form is about a minute of mixed produce (single, batch, REST v2) to four topics while
serve and a delivery worker are SIGKILLed every 20 s, a topic is deleted and re-created, the
scheduler runs key compaction and replication (and compaction, which a 20 s life rarely lets
finish), and the receiver fails 30 % of requests with odd headers. Retention runs once delivery
has drained: its 20 s window is shorter than delivery's lag beside the whole suite (the
10-minute form runs it during the load). Then every
invariant of the soak must hold. Its Spark runs take most of its time: a few minutes in all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.run import EXTERNAL, external_fragment
from bench.soak import run, splice


@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_short_soak_accounts_for_every_message(tmp_path: Path) -> None:
    report = run(1.0, kill_every_s=20.0, work=tmp_path / "soak")
    print(report.markdown("pytest tests/bench/test_soak.py"))
    assert report.problems == []
    assert report.serve_kills >= 2 and report.worker_kills >= 2 and report.recreates >= 2
    assert report.acked > 0 and report.delivered > 0
    assert (report.duplicates, report.gaps, report.lost, report.skipped, report.retention_skips) == (0, 0, 0, 0, 0)
    assert report.removed_by_retention > 0 or report.rows_removed.get("retention", 0) > 0
    assert report.job_runs["key-compaction"].get("ok", 0) >= 1
    assert report.replica_verified


def test_splice_replaces_the_soak_section_or_appends_it(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Report\n\n## Delivery\n\nfast\n")
    splice(doc, "Soak", "# Soak\n\nfirst run\n")  # the fragment's title becomes the section's heading
    assert doc.read_text() == "# Report\n\n## Delivery\n\nfast\n\n## Soak\n\nfirst run\n"
    doc.write_text(doc.read_text() + "\n## Later\n\nkept\n")
    splice(doc, "Soak", "# Soak\n\nsecond run\n\n## Detail\n\nx\n")
    assert doc.read_text() == ("# Report\n\n## Delivery\n\nfast\n\n## Soak\n\nsecond run\n\n### Detail\n\nx\n"
                               "\n## Later\n\nkept\n")


def test_make_bench_includes_the_soak_fragment_without_running_the_soak(tmp_path: Path) -> None:
    (tmp_path / "benchmarks-soak.md").write_text("# Soak\n\nsoak-marker\n")
    soak = next(ext for ext in EXTERNAL if ext.module == "bench.soak")
    fragment = external_fragment(soak, tmp_path, quick=False, timeout=5)  # a real run would take minutes
    assert fragment is not None
    title, text = fragment
    assert title == "Soak" and "soak-marker" in text and "failed" not in text and "stopped" not in text
