"""Large bodies beside small requests: what another client waits while one sends worst-case bodies.

    python -m bench.big_bodies            # writes docs/benchmarks-big-bodies.md (`make bench` includes it)
    python -m bench.big_bodies --quick    # shorter phases; only printed

One `lakebroker serve` on 127.0.0.1 (scheduled jobs off, as in every HTTP benchmark). A probe
(bench.timed_probe: wrk, one connection, closed loop) sends small single-message produce requests
for a fixed time: alone before and after (the same-run baseline), and beside each kind of large
body, which another client (curl, one request at a time, the body from a file, bounded in count
and time) sends to another topic throughout the probe's run:

- a JSON batch of 100,000 messages (the batch limit) near the 32 MiB body limit;
- an NDJSON batch of 100,000 lines, the same size;
- 32 MiB of newlines, refused once the body is in (more than MAX_NDJSON_LINES lines).

The probe runs at ack=wal, and once more at ack=none beside the JSON batches: its answer then
waits for the event loop only, not for a WAL group behind the large body's. Then a second server
runs under bench.sampler while a few bodies of each accepted kind go through, to say where the
event loop's time per body goes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.ingest import SINGLE_BODY
from bench.procs import NO_JOBS, REPO, BenchError, Server, create_topic, lakebroker_server, metrics
from bench.timed_probe import Probe, ProbeResult, write_script
from lakebroker.ingest_api.body import MAX_BATCH

FRAGMENT = REPO / "docs" / "benchmarks-big-bodies.md"
MAX_REQUEST_BYTES = 32 * 1024 * 1024  # serve's default max_request_bytes
BIG_TOPIC, PROBE_TOPIC = "big", "probe"
SLOW_MS = (50, 200)

# Where the loop's time per body goes: (row, the functions whose time it is), from bench.sampler's
# main-thread stacks; a stack counts once per row, whichever of the row's functions it holds.
STAGES = (
    ("receiving the body (the protocol's `data_received`, the route's `read_body`), over many reads",
     ("data_received", "read_body")),
    ("parsing it (`parse_batch_body`: orjson, then the columns)", ("parse_batch_body",)),
    ("of which orjson's parse (`fast_batch_items`)", ("fast_batch_items",)),
    ("of which the columns (`columns_of`)", ("columns_of",)),
    ("placing the rows (`Broker.produce_columns`), in the same piece as the parse", ("produce_columns",)),
    ("the answer's JSON, 100,000 results (`batch_results_json`), in one piece", ("batch_results_json",)),
)
PARSE, PLACE = 1, 4  # the STAGES rows that hold the loop in one piece, one after the other


@dataclass(frozen=True)
class BigBody:
    label: str
    content_type: str
    body: bytes
    expected: int  # the HTTP status the body gets


def big_bodies() -> list[BigBody]:
    """Each kind of worst-case body, as large as serve's default limits allow."""
    # {"value":"<v>"} is 12 bytes around the value, and each message costs one separator more.
    room = (MAX_REQUEST_BYTES - 64) // MAX_BATCH - 13
    message = orjson.dumps({"value": "v" * room})
    as_json = b'{"messages":[' + b",".join([message] * MAX_BATCH) + b"]}"
    as_ndjson = b"\n".join([message] * MAX_BATCH) + b"\n"
    return [
        BigBody(f"JSON batch, {MAX_BATCH:,} messages of {room} B", "application/json", as_json, 200),
        BigBody(f"NDJSON batch, {MAX_BATCH:,} lines of {room} B", "application/x-ndjson", as_ndjson, 200),
        BigBody("NDJSON body of newlines only", "application/x-ndjson", b"\n" * MAX_REQUEST_BYTES, 422),
    ]


@dataclass
class Phase:
    ack: str
    probe: ProbeResult
    big: BigBody | None
    sent: list[tuple[int, float]]  # each large body's status and seconds, from curl's start to its answer
    server_cores: float

    @property
    def label(self) -> str:
        return self.big.label if self.big is not None else "nothing (baseline)"


@dataclass
class LoopShare:
    """The event loop's CPU per body of one kind, by stage, from a sampled server."""

    big: BigBody
    bodies: int
    main_s: float  # the main thread's CPU over the window
    other_s: float  # serve's other threads' (the WAL writer, the flusher)
    stages: list[float]  # seconds per body, by STAGES row


def send_big(url: str, body_file: Path, content_type: str, deadline: float, max_count: int) -> list[tuple[int, float]]:
    """One curl at a time until the deadline or max_count bodies: (status, seconds) of each."""
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{time_total}", "--max-time", "60",
            "-H", f"Content-Type: {content_type}", "-H", "Expect:",  # no 100-continue round trip
            "--data-binary", f"@{body_file}", f"{url}/v1/topics/{BIG_TOPIC}/batch"]
    sent: list[tuple[int, float]] = []
    while len(sent) < max_count and time.monotonic() < deadline:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
        status, _, seconds = done.stdout.strip().partition(" ")
        sent.append((int(status) if status.isdigit() else 0, float(seconds or 0)))
    return sent


def _drained(server: Server, timeout: float = 60) -> None:
    """Wait (bounded) until the WAL is flushed and the server idle, so a phase's flushes stay in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and metrics(server.url).get("lakebroker_wal_backlog_bytes", 0) > 0:
        time.sleep(0.2)
    server.settle(timeout=10)


def _phase(server: Server, work: Path, script: Path, seconds: int, big: BigBody | None, max_bodies: int,
           ack: str = "wal") -> Phase:
    _drained(server)
    body_file = work / "big.body"
    if big is not None:
        body_file.write_bytes(big.body)
    cpu, started = server.cpu(), time.monotonic()
    probe = Probe(f"{server.url}/v1/topics/{PROBE_TOPIC}/messages?ack={ack}", script, seconds)
    sent = send_big(server.url, body_file, big.content_type, started + seconds, max_bodies) if big else []
    result = probe.finish()
    cores = (server.cpu() - cpu) / (time.monotonic() - started)
    if big is not None and {status for status, _ in sent} != {big.expected}:
        raise BenchError(f"{big.label}: answers {sorted({s for s, _ in sent})}, expected {big.expected}")
    return Phase(ack, result, big, sent, cores)


def _loop_share(server: Server, work: Path, big: BigBody, bodies: int) -> LoopShare:
    """Sample the server's CPU while `bodies` of `big` go through, one at a time (bench.sampler)."""
    out = work / "profile.json"
    out.unlink(missing_ok=True)
    body_file = work / "big.body"
    body_file.write_bytes(big.body)
    _drained(server)
    server.signal(signal.SIGUSR1)  # sampling on
    sent = send_big(server.url, body_file, big.content_type, time.monotonic() + 60, bodies)
    server.signal(signal.SIGUSR1)  # sampling off; the sampler writes `out`
    deadline = time.monotonic() + 30
    while not out.exists() or out.stat().st_size == 0:
        if time.monotonic() > deadline:
            raise BenchError("the sampler wrote no profile")
        time.sleep(0.05)
    time.sleep(0.2)
    raw = orjson.loads(out.read_bytes())
    stacks = [({frame.rsplit("(", 1)[-1].rstrip(")") for frame in stack.split(";")[1:]}, seconds)
              for stack, seconds in raw["stacks"].items() if stack.startswith("main;")]
    n = len(sent)
    stages = [sum(seconds for held, seconds in stacks if held & set(names)) / n for _, names in STAGES]
    threads = raw["thread_seconds"]
    return LoopShare(big, n, threads.get("main", 0.0), threads.get("worker", 0.0), stages)


@dataclass
class Run:
    phases: list[Phase]
    shares: list[LoopShare]
    peak_rss_mb: float | None
    command: str


def measure(quick: bool) -> Run:
    seconds, max_bodies, sampled_bodies = (3, 6, 2) if quick else (6, 20, 4)
    if shutil.which("wrk") is None or shutil.which("curl") is None:
        raise BenchError("bench.big_bodies needs wrk and curl")
    bodies = big_bodies()
    with tempfile.TemporaryDirectory(prefix="bench-big-bodies-") as tmp:
        work = Path(tmp)
        script = write_script(work, "probe", SINGLE_BODY, "application/json")
        with lakebroker_server(work / "data", env=NO_JOBS) as server:
            create_topic(server.url, PROBE_TOPIC)
            create_topic(server.url, BIG_TOPIC)
            Probe(f"{server.url}/v1/topics/{PROBE_TOPIC}/messages", script, 1).finish()  # warm-up
            phases = [_phase(server, work, script, seconds, None, 0)]
            phases += [_phase(server, work, script, seconds, big, max_bodies) for big in bodies]
            phases.append(_phase(server, work, script, seconds, bodies[0], max_bodies, ack="none"))
            phases.append(_phase(server, work, script, seconds, None, 0))
            peak = server.peak_rss_mb()
        with lakebroker_server(work / "sampled", env=NO_JOBS, sampled=work / "profile.json") as server:
            create_topic(server.url, BIG_TOPIC)
            shares = [_loop_share(server, work, big, sampled_bodies) for big in bodies if big.expected == 200]
    return Run(phases, shares, peak, "python -m bench.big_bodies" + (" --quick" if quick else ""))


def _row(p: Phase) -> str:
    q = p.probe
    sent = per_body = ""
    if p.big is not None:
        answers = ", ".join(str(s) for s in sorted({status for status, _ in p.sent}))
        sent = f"{len(p.sent)} x {len(p.big.body) / 2**20:.1f} MiB ({answers})"
        per_body = f"{statistics.median(t for _, t in p.sent) * 1e3:,.0f} ms"
    return (f"| {p.label} | {p.ack} | {sent} | {per_body} | {q.rps:,.0f} | {q.percentile(0.5):.1f} ms "
            f"| {q.percentile(0.99):.1f} ms | {q.percentile(0.999):.1f} ms | {q.max_ms:,.0f} ms "
            f"| {q.at_least(SLOW_MS[0])} / {q.at_least(SLOW_MS[1])} | {q.errors} | {p.server_cores:.2f} |")


def render(run: Run) -> str:
    base = [p for p in run.phases if p.big is None]
    worst = max((p for p in run.phases if p.big is not None and p.ack == "wal"), key=lambda p: p.probe.max_ms)
    loop_only = next(p for p in run.phases if p.ack == "none")
    held = max(run.shares, key=lambda s: s.stages[PARSE] + s.stages[PLACE])
    lines = [
        "## Large bodies",
        "",
        f"Command: `{run.command}` (also run by `make bench`; {time.strftime('%Y-%m-%d')}, this 2-core "
        "machine). One `lakebroker serve` on 127.0.0.1. A probe client (wrk, `-t1 -c1`, closed loop) sends "
        f"single-message produce requests ({len(SINGLE_BODY)}-byte JSON) for {base[0].probe.duration_s:.0f} s "
        "per row: alone before and after (the baseline), and in each other row while a second client (curl, "
        "one request at a time, the body from a file) sends that body to another topic's batch route over and "
        "over. wrk's script times each probe request from its send to its answer, and the figures are over "
        "every request (wrk's own percentiles would add samples for coordinated omission); a body's time runs "
        "from curl's start to its answer, the upload over loopback included.",
        "",
        f"<!-- headline: another client's single produce beside 32 MiB bodies: max {worst.probe.max_ms:,.0f} ms, "
        f"p99 {worst.probe.percentile(0.99):.0f} ms ({worst.label}); alone: max {base[0].probe.max_ms:.0f} ms, "
        f"p99 {base[0].probe.percentile(0.99):.1f} ms -->",
        "",
        "| beside | probe ack | bodies sent (answer) | time per body, median | probe req/s | probe p50 "
        f"| probe p99 | probe p99.9 | probe max | probe requests ≥ {SLOW_MS[0]} / ≥ {SLOW_MS[1]} ms "
        "| probe errors | server cores |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_row(p) for p in run.phases),
        "",
        f"serve's peak RSS over these rows: {run.peak_rss_mb:,.0f} MB." if run.peak_rss_mb else "",
        "",
        "Where the event loop's time per body goes: a second server under bench.sampler (its main thread's "
        "CPU, by function, anywhere on the stack) while bodies of each accepted kind go through one at a time, "
        "with no probe. A stage that runs in one piece holds the loop for all of its time; receiving yields "
        "between reads.",
        "",
        "| CPU per body, ms | " + " | ".join(s.big.label for s in run.shares) + " |",
        "|---|" + "---:|" * len(run.shares),
        "| the event loop (the main thread) in all | "
        + " | ".join(f"{s.main_s / s.bodies * 1e3:.0f}" for s in run.shares) + " |",
        *(f"| {row} | " + " | ".join(f"{s.stages[i] * 1e3:.0f}" for s in run.shares) + " |"
          for i, (row, _) in enumerate(STAGES)),
        "| serve's other threads (the WAL writer, the flusher), not the loop | "
        + " | ".join(f"{s.other_s / s.bodies * 1e3:.0f}" for s in run.shares) + " |",
        "",
        f"Beside these bodies another client's request waited at most {worst.probe.max_ms:,.0f} ms ({worst.label}, "
        f"ack=wal; {loop_only.probe.max_ms:,.0f} ms at ack=none, where the answer waits for the loop alone), "
        f"against {max(p.probe.max_ms for p in base):,.0f} ms alone in the same run. The longest stretch that "
        "holds the loop in one piece is the parse and the placing of the rows after it: "
        f"{(held.stages[PARSE] + held.stages[PLACE]) * 1e3:.0f} ms of CPU per body ({held.big.label}). The rest "
        "of such a wait is the same body's other stages, and the share of the "
        "two cores that goes meanwhile to everything else: the body's WAL write and flush on serve's other "
        "threads (which also take the GIL), curl, wrk and other processes on this machine.",
        "",
    ]
    return "\n".join(lines)


def run(quick: bool) -> str:
    """The section's markdown (what bench/run.py calls)."""
    return render(measure(quick))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="shorter phases; the report is only printed")
    args = parser.parse_args(argv)
    text = run(args.quick)
    if not args.quick:
        FRAGMENT.write_text(text)
    sys.stdout.write(text)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", file=sys.stderr)


if __name__ == "__main__":
    main()
