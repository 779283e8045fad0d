"""`make bench` / `make bench-quick`: run every ingest benchmark and write docs/benchmarks.md.

    python -m bench.run            # full (about 15 minutes)
    python -m bench.run --quick    # under 3 minutes in all
    python -m bench.run --tiny --out /tmp/b.md --img-dir /tmp/img --no-external   # the smoke test's run

Other engineers' benchmark modules join the report: for bench.big_bodies, bench.dedup_memory,
bench.spark_jobs, bench.delivery and bench.read_amplification, when the module exists and has
`run(quick: bool) -> str`, it runs in a child process (bounded in time) and its markdown is included;
otherwise, or if it fails, the fragment file it leaves (docs/benchmarks-big-bodies.md,
docs/benchmarks-dedup.md, docs/benchmarks-spark.md, docs/benchmarks-delivery.md,
docs/benchmarks-reads.md, docs/benchmarks-faults.md, docs/benchmarks-s3.md) is included when present.
The soak (bench.soak, `make soak`) is never run from here: only its fragment file is included.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import ingest, plots
from bench.flush import flush_rate
from bench.machine import describe
from bench.plan import PLANS
from bench.procs import REPO, baseline_server
from bench.profile import profile_server
from bench.report import Results, relative, render, visibility_headlines

QUICK_BUDGET_S = 135  # run() ends by then; + imports (~7 s on a loaded box) stays under 3 minutes
FULL_EXTERNAL_S = 1800.0


class External:
    def __init__(self, module: str, fragment: str, title: str, runs: bool = True) -> None:
        self.module, self.fragment, self.title = module, fragment, title
        self.runs = runs  # False: too long for `make bench`; only its fragment file is included


EXTERNAL = (
    External("bench.big_bodies", "benchmarks-big-bodies.md", "Large bodies"),
    External("bench.dedup_memory", "benchmarks-dedup.md", "Dedup index"),
    External("bench.spark_jobs", "benchmarks-spark.md", "Spark jobs"),
    External("bench.delivery", "benchmarks-delivery.md", "Webhook delivery"),
    External("bench.read_amplification", "benchmarks-reads.md", "Delivery reads from compacted files"),
    External("bench.faults", "benchmarks-faults.md", "Fault injection"),
    External("bench.s3", "benchmarks-s3.md", "Tables on S3"),
    External("bench.soak", "benchmarks-soak.md", "Soak", runs=False),
)


def demote(markdown: str) -> str:
    """Push a fragment's headings one level down, so its `#` title nests under this report."""
    out, fenced = [], False
    for line in markdown.strip().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append("#" + line if not fenced and line.startswith("#") else line)
    return "\n".join(out)


def nest(title: str, markdown: str) -> str:
    """A fragment demoted under its section, without its own title if that repeats the section's."""
    out = demote(markdown)
    heading = f"## {title}"
    return out[len(heading):].lstrip("\n") if out.startswith(heading + "\n") else out


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def external_fragment(ext: External, docs_dir: Path, quick: bool, timeout: float,
                      env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(title, markdown) from the module's run(quick), else from its fragment file, else None."""
    note = ""
    runnable = ext.runs and _exists(ext.module)
    if runnable and timeout <= 0:
        note = f"`{ext.module}.run` skipped: no time left in the quick run's 3-minute budget"
    elif runnable:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "fragment.md"
            argv = [sys.executable, "-m", "bench.run", "--fragment-module", ext.module, "--fragment-out", str(out)]
            if quick:
                argv.append("--quick")
            proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True, env={**os.environ, **(env or {})})
            try:
                log, _ = proc.communicate(timeout=timeout)
                if proc.returncode == 0 and out.exists():
                    return ext.title, nest(ext.title, out.read_text())
                last = (log.strip().splitlines() or [""])[-1].replace("`", "'")
                note = f"`{ext.module}.run` failed (exit {proc.returncode}): `{last}`"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: it and what it started
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.communicate(timeout=10)
                note = f"`{ext.module}.run` did not finish within {timeout:.0f} s and was stopped"
    path = docs_dir / ext.fragment
    if path.exists():
        when = datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y-%m-%d %H:%M UTC")
        prefix = (note + "; " if note else "") + f"from `{relative(path, REPO)}` written {when}"
        return ext.title, f"_{prefix}_\n\n" + nest(ext.title, path.read_text())
    if note:
        return ext.title, f"_{note}; no fragment file `{ext.fragment}` either._"
    return None


def headlines(markdown: str) -> list[str]:
    """A fragment's headline figures, marked `<!-- headline: ... -->`, for the run's summary on stdout."""
    return re.findall(r"<!-- headline: (.*?) -->", markdown)


def run_fragment_module(module: str, out: Path, quick: bool) -> None:
    mod = importlib.import_module(module)
    fn: Callable[[bool], str] | None = getattr(mod, "run", None)
    if not callable(fn):
        raise SystemExit(f"{module} has no run(quick) function")
    out.write_text(fn(quick))


def _serves_h11() -> bool:
    """True when `lakebroker serve` runs h11 (then the decomposition adds a bare-httptools reference)."""
    from bench.baseline_app import uvicorn_settings

    http = uvicorn_settings().get("http", "auto")
    name = http if isinstance(http, str) else getattr(http, "__module__", "") + "." + getattr(http, "__name__", "")
    return "h11" in name.lower()


def _attempt(results: Results, name: str, fn: Callable[[], Any]) -> Any:
    started = time.monotonic()
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - one failed benchmark must not lose the others
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        results.errors.append(f"{name}: {tb}")
        print(f"[bench] {name} FAILED: {tb}", file=sys.stderr, flush=True)
        return None
    print(f"[bench] {name} done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return value


def run(mode: str, out: Path, img_dir: Path, docs_dir: Path, *, external: bool = True, keep_work: bool = False,
        command: str = "") -> Results:
    plan = PLANS[mode]
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="lakebroker-bench-"))
    results = Results(plan=plan, machine=describe(), work_label=str(work), command=command)
    base, floor = baseline_server(work, "bare"), baseline_server(work, "fastapi")
    reference = baseline_server(work, "bare", http="httptools") if _serves_h11() else None
    helpers = [s for s in (base, floor, reference) if s is not None]
    try:
        for server in helpers:
            server.launch()
        for server in helpers:
            server.wait_ready()
        results.single = _attempt(results, "single-message produce",
                                  lambda: ingest.single_produce(plan, base, floor, work, reference))
        for server in helpers[1:]:
            server.stop()
        results.batch = _attempt(results, "batch produce", lambda: ingest.batch_produce(plan, base, work))
        results.flush = _attempt(results, "flush", lambda: flush_rate(plan, work))
        results.visibility = _attempt(results, "produce to table", lambda: ingest.produce_to_table(plan, work))
        results.profiles = _attempt(results, "profile", lambda: profile_server(plan, work)) or []
    finally:
        for server in helpers:
            server.stop()
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
    img_dir.mkdir(parents=True, exist_ok=True)
    if results.single is not None:
        path = img_dir / "produce_throughput.png"
        plots.throughput(results.single, path)
        results.images["throughput"] = relative(path, out.parent)
    if results.visibility:
        path = img_dir / "produce_to_table_cdf.png"
        plots.visibility_cdf(results.visibility, path)
        results.images["cdf"] = relative(path, out.parent)
    notes = Path(__file__).with_name("findings.md")
    if notes.exists():
        results.notes = notes.read_text()
    runnable = [ext for ext in EXTERNAL if external and ext.runs and _exists(ext.module)]
    for ext in EXTERNAL:
        budget = FULL_EXTERNAL_S
        if mode != "full" and ext in runnable:  # share what is left of the quick budget
            left = QUICK_BUDGET_S - (time.monotonic() - started)
            budget = left / (len(runnable) - runnable.index(ext))
            budget = budget if budget >= 10 else 0.0  # too little left: use the fragment file
        fragment = external_fragment(ext, docs_dir, mode != "full", budget) if external else None
        if fragment is None and not external and (docs_dir / ext.fragment).exists():
            fragment = (ext.title, nest(ext.title, (docs_dir / ext.fragment).read_text()))
        if fragment is not None:
            results.fragments.append(fragment)
    results.elapsed_s = time.monotonic() - started
    results.generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results))
    print(f"[bench] wrote {out} in {results.elapsed_s:.0f} s", file=sys.stderr, flush=True)
    for line in visibility_headlines(results):
        print(line, flush=True)
    for title, fragment in results.fragments:
        stale = " (from its fragment file, not measured in this run)" if fragment.startswith("_") else ""
        for line in headlines(fragment):
            print(f"{title}: {line}{stale}", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the lakebroker benchmarks and write docs/benchmarks.md.")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="short runs; under 3 minutes in all")
    size.add_argument("--tiny", action="store_true", help="a few seconds, figures meaningless (smoke test)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--img-dir", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--docs-dir", type=Path, default=REPO / "docs", help="where fragment files are read")
    parser.add_argument("--no-external", action="store_true", help="do not run bench.spark_jobs / bench.delivery")
    parser.add_argument("--keep-work", action="store_true", help="keep the temporary data dirs and logs")
    parser.add_argument("--fragment-module", help=argparse.SUPPRESS)
    parser.add_argument("--fragment-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fragment_module:
        run_fragment_module(args.fragment_module, args.fragment_out, args.quick)
        return
    mode = "quick" if args.quick else "tiny" if args.tiny else "full"
    command = {"quick": "make bench-quick", "full": "make bench"}.get(mode, "python -m bench.run --tiny")
    if args.no_external and mode != "tiny":
        # Say so: the other engineers' sections then come from their own last runs, each dated.
        command = f"python -m bench.run{' --quick' if args.quick else ''} --no-external"
    run(mode, args.out, args.img_dir, args.docs_dir, external=not args.no_external, keep_work=args.keep_work,
        command=command)


if __name__ == "__main__":
    main()
