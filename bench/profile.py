"""Profiles of the server process under load: where the event loop and the worker threads spend time.

The server runs under bench.sampler (a wall-clock stack sampler in the server process). For each
scenario the harness turns sampling on, runs a bounded closed-loop load, turns it off, and reads
the per-thread CPU time from /proc over the same window. The summaries are:
- CPU of the event-loop thread and of all other threads, in cores;
- the main thread's samples by the package of their innermost Python frame;
- the functions with the most samples, innermost (self) and anywhere on the stack (total).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.ingest import BATCH_PATH, PRODUCE_PATH, SINGLE_BODY, batch_body, measure
from bench.plan import Plan
from bench.procs import BenchError, Server, create_topic, lakebroker_server, thread_cpu_seconds
from bench.wrk import LoadResult

# A main-thread sample whose innermost frame is one of these is the loop waiting in epoll or
# running C code (uvloop, httptools, socket I/O) that calls back into no Python.
_LOOP_FRAMES = ("stdlib/asyncio/runners.py", "stdlib/asyncio/base_events.py", "uvicorn/server.py",
                "uvicorn/main.py", "uvicorn/_compat.py")
# A worker sample whose innermost frame is one of these is an idle pool thread.
_IDLE_FRAMES = ("stdlib/threading.py", "stdlib/concurrent/futures/thread.py", "stdlib/queue.py")
# Frames on (nearly) every stack, which say nothing in a "total" ranking.
_OUTER = ("stdlib/", "uvicorn/server.py", "uvicorn/main.py", "lakebroker/cli.py", "typer/", "click/",
          "bench/sampler.py", "lakebroker/server.py", "lakebroker/__main__.py", "<frozen runpy>")

CHAIN_SHARE = 0.5
HTTP = "HTTP protocol (uvicorn, h11)"
IDLE = "idle, or in C (uvloop, httptools, sockets)"
FRAMEWORK = ("FastAPI", "Starlette", "anyio (thread handoff)")
LAKEBROKER = ("lakebroker ingest_api", "lakebroker tables")

PACKAGES = (
    ("ingest_api/http_limits.py", HTTP),
    ("ingest_api/http_fast_produce.py", HTTP),
    ("ingest_api/", "lakebroker ingest_api"),
    ("tables/", "lakebroker tables"),
    ("fastapi/", "FastAPI"),
    ("starlette/", "Starlette"),
    ("pydantic", "pydantic"),
    ("uvicorn/", HTTP),
    ("h11/", HTTP),
    ("httptools/", HTTP),
    ("anyio/", "anyio (thread handoff)"),
    ("sniffio/", "anyio (thread handoff)"),
    ("<string>", "generated dataclass __init__/__eq__"),
    ("bench/sampler.py", "the profiler itself"),
    ("<frozen", "stdlib (other)"),
    ("prometheus_client/", "prometheus_client"),
    ("deltalake/", "deltalake"),
    ("pyarrow/", "pyarrow"),
    ("orjson", "orjson"),
    ("stdlib/asyncio/", "asyncio"),
    ("stdlib/", "stdlib (other)"),
)


def package_of(label: str) -> str:
    if label.startswith(_LOOP_FRAMES):
        return IDLE
    for prefix, name in PACKAGES:
        if label.startswith(prefix):
            return name
    return "other"


@dataclass
class Scenario:
    name: str
    load: LoadResult
    wall_s: float
    main_cpu_s: float
    other_cpu_s: float
    samples: int
    main_seconds: float
    by_package: list[tuple[str, float]]  # share of main-thread samples
    main_self: list[tuple[str, float]]
    main_total: list[tuple[str, float]]
    worker_self: list[tuple[str, float]]  # share of busy worker samples
    worker_busy_s: float
    chain: list[tuple[str, float]] = field(default_factory=list)  # frames on >= CHAIN_SHARE of stacks
    folded: dict[str, float] = field(default_factory=dict)


def summarise(name: str, load: LoadResult, wall_s: float, cpu: tuple[float, float], raw: dict[str, Any],
              top: int = 12) -> Scenario:
    main_n = raw["thread_seconds"].get("main", 0) or 1
    packages: Counter[str] = Counter()
    main_self, worker_self = [], []
    worker_busy = 0.0
    for kind, label, n in raw["self"]:
        if kind == "main":
            packages[package_of(label)] += n
            main_self.append((label, n / main_n))
        elif not label.startswith(_IDLE_FRAMES):
            worker_busy += n
            worker_self.append((label, n))
    main_total, chain = [], []
    for kind, label, n in raw["total"]:
        if kind != "main" or label.startswith(_OUTER):
            continue
        # The ASGI middleware chain sits on most stacks and has no time of its own: list it apart.
        (chain if n / main_n >= CHAIN_SHARE else main_total).append((label, n / main_n))
    return Scenario(
        name=name, load=load, wall_s=wall_s, main_cpu_s=cpu[0], other_cpu_s=cpu[1], samples=raw["samples"],
        main_seconds=main_n, by_package=[(k, v / main_n) for k, v in packages.most_common()],
        main_self=main_self[:top], main_total=main_total[:top], chain=chain,
        worker_self=[(label, n / (worker_busy or 1)) for label, n in worker_self[:top]],
        worker_busy_s=worker_busy, folded=raw.get("stacks", {}),
    )


def _profile_window(server: Server, out: Path, name: str, run: Any) -> tuple[LoadResult, float, tuple[float, float],
                                                                             dict[str, Any]]:
    out.unlink(missing_ok=True)
    before = thread_cpu_seconds(server.pid)
    started = time.monotonic()
    server.signal(signal.SIGUSR1)  # sampling on
    load = run()
    server.signal(signal.SIGUSR1)  # sampling off; the sampler writes `out`
    wall = time.monotonic() - started
    after = thread_cpu_seconds(server.pid)
    deadline = time.monotonic() + 30
    while not out.exists() or out.stat().st_size == 0:
        if time.monotonic() > deadline:
            raise BenchError(f"the sampler wrote no profile for {name}")
        time.sleep(0.05)
    time.sleep(0.2)
    main = after.get(server.pid, 0.0) - before.get(server.pid, 0.0)
    other = sum(v - before.get(t, 0.0) for t, v in after.items() if t != server.pid)
    return load, wall, (main, other), orjson.loads(out.read_bytes())


def profile_server(plan: Plan, work: Path) -> list[Scenario]:
    if plan.profile_s <= 0:
        return []
    out = work / "profile.json"
    scenarios = []
    with lakebroker_server(work / "profile-data", sampled=out) as server:
        create_topic(server.url, "bench")
        measure(server, PRODUCE_PATH, work, "profile-warmup", SINGLE_BODY, "application/json", 64, plan.warmup_s)
        c = plan.decomposition_connections
        runs = [
            (f"single-message produce, ack=wal, {c} connections",
             lambda: measure(server, PRODUCE_PATH, work, "profile-single", SINGLE_BODY, "application/json", c,
                             plan.profile_s).runs[0]),
        ]
        fmt, size = plan.batch_bodies[0]
        body, ctype = batch_body(fmt, size)
        runs.append((f"batch produce, {size}-message {fmt.upper()} bodies, {plan.batch_connections} connections",
                     lambda: measure(server, BATCH_PATH, work, "profile-batch", body, ctype, plan.batch_connections,
                                     plan.profile_s).runs[0]))
        for name, run in runs:
            load, wall, cpu, raw = _profile_window(server, out, name, run)
            scenarios.append(summarise(name, load, wall, cpu, raw))
    return scenarios
