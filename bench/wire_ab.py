"""Issue 11's single-produce check, A/B in one run: `wrk -t1 -c32 -d10s` with the issue's body against
the bare ASGI app (bench.baseline_app) and against `lakebroker serve`, alternated.

    python -m bench.wire_ab [--rounds 2] [--duration 10] [--ack wal]

Both servers run on 127.0.0.1 under the same uvicorn settings; serve has its scheduled Spark jobs
off (they would land in the measurement) and is otherwise at its defaults: ack=wal, fdatasync'd
group commit, the delivery child on. Each round measures the bare app then lakebroker (B-A order
every other round) and prints req/s, the ratio, and each server's CPU per request (user+system of
the process over the run, wrk's own CPU not included), with lakebroker's busiest threads. Every step
is bounded in time: wrk by -d and a process timeout, the servers' start by a deadline.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.procs import (
    NO_JOBS,
    BenchError,
    Server,
    baseline_server,
    cpu_seconds,
    create_topic,
    lakebroker_server,
    thread_cpu_seconds,
)
from bench.wrk import LoadResult, have_wrk, run_wrk, write_script

BODY = b'{"key":"user-1","value":"hello world 0123456789 0123456789 0123456789 0123456789"}'
PATH = "/v1/topics/bench/messages"


@dataclass
class Run:
    """One wrk run against one server, with the server's CPU over it."""

    server: str
    load: LoadResult
    cpu_s: float  # the server process
    children_cpu_s: float  # its child processes (serve's delivery worker)
    threads: list[tuple[str, float]]  # (thread name, CPU seconds), busiest first

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / self.load.requests * 1e6 if self.load.requests else 0.0

    @property
    def children_cpu_us(self) -> float:
        return self.children_cpu_s / self.load.requests * 1e6 if self.load.requests else 0.0


def _thread_names(pid: int) -> dict[int, str]:
    names: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            continue
    return names


def _children(pid: int) -> list[int]:
    """`pid`'s child processes (serve's delivery worker), whose CPU is the server's too."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _children_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            continue  # it ended
    return total


def measure(server: Server, url: str, script: Path, connections: int, duration_s: float) -> Run:
    children = _children(server.pid)
    before, cpu0, child0 = thread_cpu_seconds(server.pid), server.cpu(), _children_cpu(children)
    load = run_wrk(url, script, connections, duration_s)
    after, cpu1, child1 = thread_cpu_seconds(server.pid), server.cpu(), _children_cpu(children)
    names = _thread_names(server.pid)
    used = sorted(((f"{names.get(tid, '?')}[{tid}]", cpu - before.get(tid, 0.0)) for tid, cpu in after.items()),
                  key=lambda t: -t[1])
    server.settle()
    return Run(server.name, load, cpu1 - cpu0, child1 - child0, [t for t in used if t[1] > 0][:5])


def ab(rounds: int, duration_s: float, connections: int, ack: str, partitions: int, work: Path,
       warmup_s: float = 1) -> list[tuple[Run, Run]]:
    if not have_wrk():
        raise BenchError("wrk is not installed: this check is defined by wrk -t1 -c32")
    script = write_script(work, "single", BODY, "application/json")
    bare = baseline_server(work).launch()
    lake = lakebroker_server(work / "data", env=NO_JOBS).launch()
    try:
        bare.wait_ready(60)
        lake.wait_ready(120)
        create_topic(lake.url, "bench", partitions)
        targets = [(bare, bare.url + PATH), (lake, f"{lake.url}{PATH}?ack={ack}")]
        for server, url in targets if warmup_s > 0 else []:  # warm both (first WAL segment, Delta commit)
            run_wrk(url, script, connections, warmup_s)
            server.settle()
        out: list[tuple[Run, Run]] = []
        for k in range(rounds):
            order = targets if k % 2 == 0 else targets[::-1]
            runs = {server.name: measure(server, url, script, connections, duration_s) for server, url in order}
            out.append((runs[bare.name], runs[lake.name]))
            report(k + 1, *out[-1])
        return out
    finally:
        lake.stop()
        bare.stop()


def report(round_no: int, bare: Run, lake: Run) -> None:
    ratio = lake.load.ok_rps / bare.load.rps if bare.load.rps else 0.0
    print(f"round {round_no}: bare {bare.load.rps:,.0f} req/s ({bare.cpu_us:.0f} us CPU/req) | "
          f"lakebroker {lake.load.ok_rps:,.0f} msg/s ({lake.cpu_us:.0f} us CPU/msg + {lake.children_cpu_us:.0f} in "
          f"child processes, {lake.load.errors} errors, "
          f"p50 {lake.load.p50_ms:.2f} ms) | ratio {ratio:.2f}x", flush=True)
    print("  lakebroker threads (CPU s): " + ", ".join(f"{name} {cpu:.2f}" for name, cpu in lake.threads),
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--ack", choices=["none", "wal", "table"], default="wal")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load on each server first (0: none)")
    args = parser.parse_args()
    started = time.monotonic()
    print(f"wrk -t1 -c{args.connections} -d{args.duration:g}s, body {BODY.decode()}, ack={args.ack}", flush=True)
    with tempfile.TemporaryDirectory(prefix="wire-ab-") as tmp:
        ab(args.rounds, args.duration, args.connections, args.ack, args.partitions, Path(tmp), args.warmup)
    print(f"done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
