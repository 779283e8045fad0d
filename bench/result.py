"""What a scenario declares, and what its run returns: data, written as JSON, rendered by bench/report.md.j2.

A scenario module (bench/scenarios/*.py) holds one `SCENARIO = Scenario(...)`: its set-up, load, metric and
target in words, and the function that measures. That function returns a `Result`: the checks against
stated targets (numbers), the tables and notes of the figures, and the raw numbers that tests read.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"

Mode = Literal["full", "quick", "tiny"]  # `make bench`, `make bench-quick`, the smoke test's seconds


@dataclass
class Check:
    """One stated target judged in this run."""

    name: str
    value: float
    unit: str  # how `value` reads: "x", "msg/s", "rows/s", "ms", "MB"
    target: float
    higher_is_better: bool = True
    baseline: str = ""  # the same run's reference, in words, when the target is relative to one

    @property
    def met(self) -> bool:
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    def shown(self, x: float) -> str:
        if self.unit == "x":
            return f"{x:.2f}x"
        if float(x).is_integer() or abs(x) >= 10:
            return f"{x:,.0f} {self.unit}"
        return f"{x:,.2f} {self.unit}"

    @property
    def target_text(self) -> str:
        return ("≥ " if self.higher_is_better else "≤ ") + self.shown(self.target)


@dataclass
class Table:
    caption: str
    head: list[str]
    rows: list[list[str]]


@dataclass
class Image:
    caption: str
    path: str  # relative to docs/, where the page is


@dataclass
class Result:
    scenario: str
    mode: str = "full"
    command: str = ""
    checks: list[Check] = field(default_factory=list)
    headlines: list[str] = field(default_factory=list)  # printed at the end of `make bench`
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # the reading of this run's figures (markdown paragraphs)
    images: list[Image] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)  # raw numbers for tests and the reading
    measured_at: str = ""
    commit: str = ""
    elapsed_s: float = 0.0
    error: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, data: bytes) -> Result:
        raw = orjson.loads(data)
        raw["checks"] = [Check(**c) for c in raw.get("checks", [])]
        raw["tables"] = [Table(**t) for t in raw.get("tables", [])]
        raw["images"] = [Image(**i) for i in raw.get("images", [])]
        return cls(**raw)

    def stamp(self, mode: Mode, elapsed_s: float) -> Result:
        self.mode, self.elapsed_s = mode, elapsed_s
        self.command = self.command or ("python -m bench.run" + (" --quick" if mode == "quick" else "")
                                        + f" --only {self.scenario}")
        self.measured_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        self.commit = head_commit()
        return self


@dataclass(frozen=True)
class Scenario:
    name: str  # the module's name, and its results file's
    title: str
    setup: str
    load: str
    metric: str
    target: str
    measure: Callable[[Mode, Path], Result]  # (mode, a scratch directory) -> this run's result
    in_make_bench: bool = True  # False: too long for `make bench` (its own make target writes its result)
    timeout_s: float = 1800.0  # in `make bench`; quick and tiny runs share the quick budget

    def result_path(self, results_dir: Path = RESULTS_DIR) -> Path:
        return results_dir / f"{self.name}.json"


BENCH_OUTPUTS = ("bench/results/", "docs/benchmarks.md", "docs/img/")
PAGE = REPO / "docs" / "benchmarks.md"


def uncommitted(repo: Path = REPO) -> list[str]:
    """The tracked files that differ from HEAD, besides what a run writes itself (the results, the
    page, its images): figures measured on such a tree would name a commit that did not run."""
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                             capture_output=True, text=True, timeout=10, check=True).stdout.splitlines()
    return [line[3:] for line in changed if not line[3:].startswith(BENCH_OUTPUTS)]


def head_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = uncommitted()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("GITHUB_SHA", "")[:7]
    return out + ("+changes" if dirty else "")


def refuse_uncommitted(command: str) -> None:
    """Exit before measuring when the tree has uncommitted changes: every published figure comes
    from a commit anyone can check out."""
    try:
        dirty = uncommitted()
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(f"{command}: cannot tell whether the tree is committed ({exc}); "
                         "run it in a git checkout") from None
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise SystemExit(f"{command} publishes figures only from a committed tree; commit or stash first "
                         f"({len(dirty)} changed: {shown})")


def table(caption: str, head: list[str], rows: list[list[Any]]) -> Table:
    return Table(caption, head, [[str(cell) for cell in row] for row in rows])
