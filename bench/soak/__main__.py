"""`make soak`: `python -m bench.soak --minutes 10`; writes bench/results/soak.json and re-renders docs/benchmarks.md.
`make soak-cluster` adds `--nodes 3` (bench/results/soak_cluster.json).

Exits 1 when the soak fails (a check not met). bench.run cannot run it this way: its kill period, its minutes
and a kept work dir are options here.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench.report import render
from bench.result import PAGE, RESULTS_DIR, refuse_uncommitted
from bench.scenarios import every
from bench.scenarios.soak import SCENARIO as SINGLE
from bench.scenarios.soak_cluster import NODES, SEED
from bench.scenarios.soak_cluster import SCENARIO as CLUSTER
from bench.soak import run
from bench.soak.report import passed, to_result


def _keep_logs(work: Path) -> None:
    """A failed soak's server and worker logs, kept past its temporary work dir for a post-mortem."""
    kept = Path(tempfile.mkdtemp(prefix="lakebroker-soak-failed-"))
    for log in work.rglob("*.log"):
        target = kept / log.relative_to(work)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(log, target)
    print(f"[soak] failed: its logs are kept in {kept}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The soak: mixed load with faults, then every message checked.")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between SIGKILLs of serve")
    parser.add_argument("--nodes", type=int, choices=(1, NODES), default=1,
                        help=f"serve processes; {NODES}: a cluster sharing a table root, one killed at a time")
    parser.add_argument("--seed", type=int, help=f"the load's and the nemesis's seed (default 12; {SEED} on a cluster)")
    parser.add_argument("--work", type=Path, help="keep data and logs here")
    parser.add_argument("--no-docs", action="store_true", help="print only; write no result and leave docs/ alone")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=PAGE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else (12 if args.nodes == 1 else SEED)
    if not args.no_docs and args.out == PAGE:
        refuse_uncommitted("make soak" if args.nodes == 1 else "make soak-cluster")
    if args.work is not None:
        report = run(args.minutes, args.work, kill_every_s=args.kill_every, seed=seed, nodes=args.nodes)
    else:
        with tempfile.TemporaryDirectory(prefix="lakebroker-soak-", ignore_cleanup_errors=True) as tmp:
            report = run(args.minutes, Path(tmp), kill_every_s=args.kill_every, seed=seed, nodes=args.nodes)
            if not passed(to_result(report)):
                _keep_logs(Path(tmp))
    result = to_result(report).stamp("full", report.seconds)
    scenario = SINGLE if args.nodes == 1 else CLUSTER
    made = "make soak" if args.nodes == 1 else "make soak-cluster"
    result.command = made if (args.minutes, args.kill_every, args.seed) == (10.0, 60.0, None) else (
        f"python -m bench.soak --minutes {args.minutes:g} --kill-every {args.kill_every:g}"
        + ("" if args.nodes == 1 else f" --nodes {args.nodes}") + ("" if args.seed is None else f" --seed {seed}"))
    for line in result.headlines:
        print(f"{scenario.title}: {line}", flush=True)
    for c in result.checks:
        print(f"{scenario.title}: {c.name}: {c.shown(c.value)} (target {c.target_text}: "
              f"{'met' if c.met else 'NOT MET'})", flush=True)
    for problem in report.problems:
        print(f"- {problem}", flush=True)
    print(*result.figures["replica_tail"][-1:], file=sys.stderr)
    if not args.no_docs:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        scenario.result_path(args.results_dir).write_bytes(result.to_json())
        args.out.write_text(render(every(), args.results_dir))
        print(f"[soak] wrote {scenario.result_path(args.results_dir)} and {args.out}", file=sys.stderr)
    sys.exit(0 if passed(result) else 1)


if __name__ == "__main__":
    main()
