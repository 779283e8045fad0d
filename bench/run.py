"""`make bench` / `make bench-quick`: run the scenarios, write their results as JSON, render docs/benchmarks.md.

    python -m bench.run                       # every scenario of `make bench` (about 30 minutes)
    python -m bench.run --quick               # shorter runs, under 3 minutes in all; results not kept
    python -m bench.run --only flush --only s3  # some scenarios; the others' last results stay in the page
    python -m bench.run --render              # re-render docs/benchmarks.md from bench/results/

Each scenario runs in its own process, bounded in time, and writes bench/results/<name>.json; a scenario that
fails or times out keeps its last good result, and the page says so.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bench.harness.machine import describe
from bench.report import RUN_FILE, render
from bench.result import PAGE, REPO, RESULTS_DIR, Mode, Result, Scenario, refuse_uncommitted
from bench.scenarios import ORDER, every, scenario

QUICK_BUDGET_S = 150.0  # what the quick run's scenarios share


def measure_in_process(s: Scenario, mode: Mode) -> Result:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"bench-{s.name}-") as work:
        result = s.measure(mode, Path(work))
    return result.stamp(mode, time.monotonic() - started)


def measure_in_child(spec: str, mode: Mode, out: Path, timeout_s: float) -> str:
    """Run one scenario (a name, or `module:ATTRIBUTE`) in its own process group; '' when it wrote `out`,
    else why not."""
    argv = [sys.executable, "-m", "bench.run", "--child", spec, "--mode", mode, "--child-out", str(out)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own group: it and the servers it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=10)
        return f"did not finish within {timeout_s:.0f} s"
    sys.stderr.write(log)
    if proc.returncode == 0 and out.exists():
        return ""
    last = (log.strip().splitlines() or [""])[-1].replace("`", "'")
    return f"exit {proc.returncode}: {last}"


def run(mode: Mode, names: list[str], out: Path, results_dir: Path, command: str) -> dict[str, str]:
    """Measure `names` (each in a child process), keep their results, render the page; {name: why it failed}."""
    chosen = [(name, scenario(name)) for name in names]
    results_dir.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}
    started = time.monotonic()
    run_info = {"command": command, "machine": dataclasses.asdict(describe())}
    for i, (spec, s) in enumerate(chosen):
        budget = s.timeout_s
        if mode != "full":
            budget = (QUICK_BUDGET_S - (time.monotonic() - started)) / (len(chosen) - i)
            if budget < 10:
                failed[s.name] = "no time left in the quick run's budget"
                continue
        target = s.result_path(results_dir)
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / "result.json"
            print(f"[bench] {s.name} ...", file=sys.stderr, flush=True)
            why = measure_in_child(spec, mode, fresh, budget)
            if why:
                failed[s.name] = why
                print(f"[bench] {s.name} FAILED: {why}", file=sys.stderr, flush=True)
                continue
            target.write_bytes(fresh.read_bytes())
        result = Result.from_json(target.read_bytes())
        print(f"[bench] {s.name} done in {result.elapsed_s:.0f} s", file=sys.stderr, flush=True)
        for line in result.headlines:
            print(f"{s.title}: {line}", flush=True)
        for check in result.checks:
            print(f"{s.title}: {check.name}: {check.shown(check.value)} (target {check.target_text}: "
                  f"{'met' if check.met else 'NOT MET'})", flush=True)
    (results_dir / RUN_FILE).write_bytes(orjson.dumps(run_info, option=orjson.OPT_INDENT_2))
    out.write_text(render(every(), results_dir, failed))
    print(f"[bench] wrote {out} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return failed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the lakebroker benchmarks and write docs/benchmarks.md.")
    parser.add_argument("--quick", action="store_true", help="short runs, under 3 minutes in all; not kept")
    parser.add_argument("--only", action="append", choices=ORDER, help="run only this scenario (repeatable)")
    parser.add_argument("--render", action="store_true", help="only re-render the page from the kept results")
    parser.add_argument("--out", type=Path, help="the page (default docs/benchmarks.md; a quick run writes "
                                                  "one only when given --out)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="full", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.child_out.write_bytes(measure_in_process(scenario(args.child), args.mode).to_json())
        return
    page = args.out or PAGE
    if args.render:
        page.write_text(render(every(), args.results_dir))
        return
    names = args.only or [s.name for s in every() if s.in_make_bench]
    if args.quick:
        with tempfile.TemporaryDirectory(prefix="bench-quick-") as tmp:  # quick figures are not kept
            failed = run("quick", names, args.out or Path(tmp) / "benchmarks.md", Path(tmp) / "results",
                         "make bench-quick")
    else:
        command = "make bench" if not args.only else "python -m bench.run " + " ".join(f"--only {n}" for n in names)
        if page == PAGE:
            refuse_uncommitted(command)
        failed = run("full", names, page, args.results_dir, command)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
