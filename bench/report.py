"""docs/benchmarks.md from bench/results/*.json, through the template bench/report.md.j2."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import orjson

from bench.result import RESULTS_DIR, Result, Scenario

TEMPLATE = Path(__file__).with_name("report.md.j2")
RUN_FILE = "_run.json"  # the last `make bench`'s command and machine


@dataclass
class Section:
    scenario: Scenario
    result: Result | None
    stale: str = ""  # why these figures are not from the last run, when they are not
    missing: str = ""

    @property
    def anchor(self) -> str:
        return re.sub(r"[^a-z0-9 -]", "", self.scenario.title.lower()).replace(" ", "-")


def load(scenario: Scenario, results_dir: Path = RESULTS_DIR) -> Result | None:
    path = scenario.result_path(results_dir)
    return Result.from_json(path.read_bytes()) if path.exists() else None


def sections(scenarios: list[Scenario], results_dir: Path, failed: dict[str, str]) -> list[Section]:
    out = []
    for s in scenarios:
        result = load(s, results_dir)
        if result is None:
            how = f"`make {s.name.replace('_', '-')}`" if not s.in_make_bench else "`make bench`"
            why = f"this run's attempt failed ({failed[s.name]}); " if s.name in failed else ""
            out.append(Section(s, None, missing=f"{why}run {how} to measure it."))
            continue
        stale = ""
        if s.name in failed:
            stale = f"this run's attempt failed ({failed[s.name]}), so these figures are its last good run's"
        elif not s.in_make_bench:
            stale = "written by its own make target, not by `make bench`"
        out.append(Section(s, result, stale=stale))
    return out


def render(scenarios: list[Scenario], results_dir: Path = RESULTS_DIR, failed: dict[str, str] | None = None) -> str:
    run: dict[str, Any] = {"command": "make bench", "machine": None}
    run_file = results_dir / RUN_FILE
    if run_file.exists():
        run = orjson.loads(run_file.read_bytes())
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE.parent), autoescape=False,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    text = env.get_template(TEMPLATE.name).render(results=sections(scenarios, results_dir, failed or {}),
                                                  run=run, machine=run["machine"])
    return re.sub(r"\n{3,}", "\n\n", text)

