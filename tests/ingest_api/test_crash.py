"""SIGKILL the server during produce load, again and again: no acknowledged message is lost,
none is duplicated, and every partition's offsets stay dense.

CI runs a short form; LAKEBROKER_CRASH_CYCLES sets the cycle count. The long form is the benchmark
scenario bench/scenarios/faults.py (`python -m bench.run --only faults`, also run by `make fault`), which
records its figures in docs/benchmarks.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.scenarios.faults import crash_cycles

pytestmark = pytest.mark.fault
CYCLES = int(os.environ.get("LAKEBROKER_CRASH_CYCLES", "3"))


def test_sigkill_under_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    report = crash_cycles(tmp_path / "data", CYCLES)
    assert report.acknowledged > 100 * CYCLES, f"the load acknowledged only {report.acknowledged} messages"
    assert report.lost == [], f"{len(report.lost)} acknowledged messages lost, e.g. {report.lost[:5]}"
    assert report.duplicated == [], f"{len(report.duplicated)} stored twice, e.g. {report.duplicated[:5]}"
    assert report.moved == [], f"{len(report.moved)} not at their acknowledged offset, e.g. {report.moved[:5]}"
    assert report.gaps == [], f"partitions {report.gaps} have offset gaps"
