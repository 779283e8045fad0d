"""Only sections 2 (batch produce) and 3 (WAL→Delta flush) of docs/benchmarks.md, with their
same-run baselines: `python -m bench.batch_flush [--quick]` prints the two sections' markdown.

For measuring a change to the batch or flush path without the whole run (bench.run); the
sections are rendered by bench.report exactly as `make bench` renders them.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from bench import ingest
from bench.flush import flush_rate
from bench.machine import describe
from bench.plan import PLANS
from bench.procs import baseline_server
from bench.report import Results, batch_section, flush_section


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="the quick plan's durations (make bench-quick)")
    args = parser.parse_args(argv)
    plan = PLANS["quick" if args.quick else "full"]
    work = Path(tempfile.mkdtemp(prefix="lakebroker-bench-"))
    results = Results(plan=plan, machine=describe())
    base = baseline_server(work, "bare")
    try:
        base.launch()
        base.wait_ready()
        results.batch = ingest.batch_produce(plan, base, work)
    finally:
        base.stop()
    results.flush = flush_rate(plan, work)
    shutil.rmtree(work, ignore_errors=True)
    print(batch_section(results))
    print(flush_section(results))


if __name__ == "__main__":
    main()
