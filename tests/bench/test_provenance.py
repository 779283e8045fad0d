"""Published figures name a tree anyone can check out: `make bench` and `make soak` refuse to write
docs/benchmarks.md from a tree with uncommitted changes, and what a run writes itself does not
count as a change."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import bench.result
import bench.run
import bench.soak.__main__ as soak_cli
from bench.result import uncommitted


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_uncommitted_lists_changed_files_but_not_a_runs_own_outputs(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    for path in ("ingest_api/broker.py", "docs/benchmarks.md", "bench/results/flush.json", "docs/cluster.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("one\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "tree")
    assert uncommitted(tmp_path) == []
    for path in ("docs/benchmarks.md", "bench/results/flush.json"):
        (tmp_path / path).write_text("figures\n")
    assert uncommitted(tmp_path) == []
    (tmp_path / "ingest_api/broker.py").write_text("two\n")
    (tmp_path / "docs/cluster.md").unlink()
    assert sorted(uncommitted(tmp_path)) == ["docs/cluster.md", "ingest_api/broker.py"]


def test_make_bench_and_make_soak_refuse_to_publish_from_a_changed_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.result, "uncommitted", lambda repo=bench.result.REPO: [f"f{i}.py" for i in range(7)])

    def measured(*_: object, **__: object) -> None:
        raise AssertionError("nothing is measured from a changed tree")

    monkeypatch.setattr(bench.run, "run", measured)
    monkeypatch.setattr(soak_cli, "run", measured)
    with pytest.raises(SystemExit) as refused:
        bench.run.main(["--only", "flush"])
    assert str(refused.value) == ("python -m bench.run --only flush publishes figures only from a committed tree; "
                                  "commit or stash first (7 changed: f0.py, f1.py, f2.py, f3.py, f4.py and 2 more)")
    with pytest.raises(SystemExit) as refused:
        soak_cli.main(["--nodes", "3"])
    assert str(refused.value).startswith("make soak-cluster publishes figures only from a committed tree")
