"""bench.spark_jobs: only a full run replaces docs/benchmarks-spark.md; a quick run prints its report."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import spark_jobs


@pytest.fixture
def fragment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "benchmarks-spark.md"
    path.write_text("# Spark jobs\n\nfull-size figures\n")
    monkeypatch.setattr(spark_jobs, "FRAGMENT", path)
    monkeypatch.setattr(spark_jobs, "measure", lambda quick: f"# Spark jobs\n\nmeasured quick={quick}\n")
    return path


def test_quick_mode_prints_and_leaves_the_fragment(fragment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert spark_jobs.main(["--quick"]) == 0
    assert "measured quick=True" in capsys.readouterr().out
    assert fragment.read_text() == "# Spark jobs\n\nfull-size figures\n"
    assert spark_jobs.run(True) == "# Spark jobs\n\nmeasured quick=True\n"  # what bench/run.py calls
    assert "full-size figures" in fragment.read_text()


def test_full_mode_writes_the_fragment(fragment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert spark_jobs.main([]) == 0
    assert "measured quick=False" in capsys.readouterr().out
    assert fragment.read_text() == "# Spark jobs\n\nmeasured quick=False\n"


def test_quick_help_says_the_fragment_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        spark_jobs.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "only printed" in help_text and "docs/benchmarks-spark.md keeps the full run's figures" in help_text
