"""Profiles of the server under single and batch produce: where the event loop's and the other threads' CPU
goes, by package and by function (bench/harness/sampler.py in the server process)."""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.harness.compare import measure
from bench.harness.servers import BenchError, Server, create_topic, lakebroker_server, thread_cpu_seconds
from bench.harness.wrk import LoadResult
from bench.result import Mode, Result, Table, table
from bench.result import Scenario as Declared
from bench.scenarios.batch_produce import BATCH_PATH, batch_body
from bench.scenarios.single_produce import PRODUCE_PATH, SINGLE_BODY

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
class Profile:
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
              top: int = 12) -> Profile:
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
    main_total: list[tuple[str, float]] = []
    chain: list[tuple[str, float]] = []
    for kind, label, n in raw["total"]:
        if kind != "main" or label.startswith(_OUTER):
            continue
        # The ASGI middleware chain sits on most stacks and has no time of its own: list it apart.
        (chain if n / main_n >= CHAIN_SHARE else main_total).append((label, n / main_n))
    return Profile(
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


SECONDS = {"full": 10.0, "quick": 2.0, "tiny": 1.0}
WARMUP_S = {"full": 3.0, "quick": 1.0, "tiny": 0.5}
SINGLE_CONNECTIONS, BATCH_CONNECTIONS = 64, 4


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _tables(s: Profile) -> list[Table]:
    chain = ", ".join(f"`{k.split('(')[-1].rstrip(')')}` ({k.split(':')[0]}) {_pct(v)}" for k, v in s.chain)
    return [
        table(f"**{s.name}**: {s.load.ok_rps:,.0f} req/s while profiled (sampling costs throughput: compare the "
              f"unprofiled scenario), over {s.wall_s:.1f} s. Event-loop thread: {s.main_cpu_s / s.wall_s:.2f} cores; "
              f"all other threads: {s.other_cpu_s / s.wall_s:.2f} cores (from /proc/PID/task). {s.samples:,} samples.",
              ["package of the innermost frame", "share of event-loop CPU"],
              [[k, _pct(v)] for k, v in s.by_package[:10]]),
        table("Event-loop thread, innermost frames:", ["function (self)", "share"],
              [[f"`{k}`", _pct(v)] for k, v in s.main_self]),
        table("Event-loop thread, inclusive. Left out: the frames on (nearly) every stack, and the ASGI middleware "
              f"chain each request passes through, on at least half the samples: {chain or 'none'}.",
              ["function (total)", "share"], [[f"`{k}`", _pct(v)] for k, v in s.main_total]),
        table("Other threads (WAL writes, Delta commits), busy CPU only:", ["function (self)",
                                                                            "share of busy worker CPU"],
              [[f"`{k}`", _pct(v)] for k, v in s.worker_self[:8]]),
    ]


def run(mode: Mode, work: Path) -> Result:
    seconds = SECONDS[mode]
    out = work / "profile.json"
    profiles = []
    with lakebroker_server(work / "profile-data", sampled=out) as server:
        create_topic(server.url, "bench")
        measure(server, PRODUCE_PATH, work, "profile-warmup", SINGLE_BODY, "application/json", 64, WARMUP_S[mode])
        body, ctype = batch_body("json", 1000)
        runs = [
            (f"single-message produce, ack=wal, {SINGLE_CONNECTIONS} connections",
             lambda: measure(server, PRODUCE_PATH, work, "profile-single", SINGLE_BODY, "application/json",
                             SINGLE_CONNECTIONS, seconds).runs[0]),
            (f"batch produce, 1000-message JSON bodies, {BATCH_CONNECTIONS} connections",
             lambda: measure(server, BATCH_PATH, work, "profile-batch", body, ctype, BATCH_CONNECTIONS,
                             seconds).runs[0]),
        ]
        for name, load in runs:
            loaded, wall, cpu, raw = _profile_window(server, out, name, load)
            profiles.append(summarise(name, loaded, wall, cpu, raw))
    return Result(
        scenario="profile", tables=[t for p in profiles for t in _tables(p)],
        figures={"profiles": [{"name": p.name, "samples": p.samples, "main_seconds": p.main_seconds,
                               "main_cores": p.main_cpu_s / p.wall_s, "other_cores": p.other_cpu_s / p.wall_s,
                               "by_package": dict(p.by_package)} for p in profiles]},
    )


SCENARIO = Declared(
    name="profile", title="Profiles of the server under load", measure=run,
    setup="`lakebroker serve` under bench/harness/sampler.py: SIGPROF every 2 ms of process CPU, each thread's "
          "stack weighted by the CPU it used since its previous sample (idle time weighs nothing); sampling is "
          "switched on and off around each load by SIGUSR1, and each thread's CPU is read from /proc over the "
          "same window.",
    load=f"wrk `-t1`, closed loop, 10 s each: single-message produce at ack=wal with {SINGLE_CONNECTIONS} "
         f"connections, then 1,000-message JSON batches with {BATCH_CONNECTIONS}.",
    metric="The event loop's and the other threads' cores; the event loop's CPU by the package of the innermost "
           "frame, by function innermost (self) and anywhere on the stack (total); the worker threads' busy CPU "
           "by function.",
    target="None: this says where the time of the single and batch produce scenarios goes.",
)
