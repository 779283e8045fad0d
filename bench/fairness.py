"""Only section 4 of docs/benchmarks.md, fairness included: `python -m bench.fairness [--quick]`.

A 200 msg/s single-message probe (bench.loadgen) on an idle server, its same-run baseline, then
the same probe beside a saturating flood of 1,000-message batches (wrk, its own process) on the
same server; prints the section's markdown and its summary rows, rendered by bench.report
exactly as `make bench` renders them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from bench import ingest
from bench.machine import describe
from bench.plan import PLANS
from bench.report import Results, summary, visibility_section


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="the quick plan's durations (make bench-quick)")
    parser.add_argument("--seconds", type=float, help="probe duration (default: the plan's)")
    parser.add_argument("--flood-connections", type=int, help="wrk connections of the flood (default: the plan's, "
                        "32)")
    args = parser.parse_args(argv)
    plan = replace(PLANS["quick" if args.quick else "full"], visibility_under_load=True)
    if args.seconds:
        plan = replace(plan, visibility_s=args.seconds)
    if args.flood_connections:
        plan = replace(plan, flood_connections=args.flood_connections)
    work = Path(tempfile.mkdtemp(prefix="lakebroker-bench-"))
    results = Results(plan=plan, machine=describe())
    try:
        results.visibility = ingest.produce_to_table(plan, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(summary(results))
    print(visibility_section(results))


if __name__ == "__main__":
    main()
