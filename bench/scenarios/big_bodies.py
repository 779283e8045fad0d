"""Large bodies beside small requests: what another client's single produce waits while one client sends
worst-case bodies (32 MiB JSON and NDJSON batches, 32 MiB of newlines), against the same run's baseline,
and where the event loop's time per body goes, from a sampled server.
"""

from __future__ import annotations

import shutil
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.harness.probe import Probe, ProbeResult, write_script
from bench.harness.servers import NO_JOBS, BenchError, Server, create_topic, lakebroker_server, metrics
from bench.result import Mode, Result, Scenario, table
from bench.scenarios.single_produce import SINGLE_BODY
from lakebroker.ingest_api.body import MAX_BATCH

MAX_REQUEST_BYTES = 32 * 1024 * 1024  # serve's default max_request_bytes
BIG_TOPIC, PROBE_TOPIC = "big", "probe"
SLOW_MS = (50, 200)
# (seconds per row, large bodies per row at most, bodies of each kind through the sampled server)
SIZES: dict[str, tuple[int, int, int]] = {"full": (6, 20, 4), "quick": (3, 6, 2), "tiny": (1, 1, 1)}

# Where the loop's time per body goes: (row, the functions whose time it is), from bench.harness.sampler's
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

    def figures(self) -> dict[str, object]:
        q = self.probe
        return {"beside": self.label, "ack": self.ack, "bodies": len(self.sent),
                "body_mib": len(self.big.body) / 2**20 if self.big else 0.0,
                "answers": sorted({status for status, _ in self.sent}),
                "per_body_ms": statistics.median(t for _, t in self.sent) * 1e3 if self.sent else 0.0,
                "rps": q.rps, "p50_ms": q.percentile(0.5), "p99_ms": q.percentile(0.99),
                "p999_ms": q.percentile(0.999), "max_ms": q.max_ms,
                "slow": [q.at_least(SLOW_MS[0]), q.at_least(SLOW_MS[1])], "errors": q.errors,
                "server_cores": self.server_cores}


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
    """Sample the server's CPU while `bodies` of `big` go through, one at a time (bench.harness.sampler)."""
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


def _measure(mode: Mode, work: Path) -> tuple[list[Phase], list[LoopShare], float | None]:
    seconds, max_bodies, sampled_bodies = SIZES[mode]
    if shutil.which("wrk") is None or shutil.which("curl") is None:
        raise BenchError("bench.scenarios.big_bodies needs wrk and curl")
    bodies = big_bodies()
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
    return phases, shares, peak


def _row(p: Phase) -> list[str]:
    q, sent, per_body = p.probe, "", ""
    if p.big is not None:
        answers = ", ".join(str(s) for s in sorted({status for status, _ in p.sent}))
        sent = f"{len(p.sent)} x {len(p.big.body) / 2**20:.1f} MiB ({answers})"
        per_body = f"{statistics.median(t for _, t in p.sent) * 1e3:,.0f} ms"
    return [p.label, p.ack, sent, per_body, f"{q.rps:,.0f}", f"{q.percentile(0.5):.1f} ms",
            f"{q.percentile(0.99):.1f} ms", f"{q.percentile(0.999):.1f} ms", f"{q.max_ms:,.0f} ms",
            f"{q.at_least(SLOW_MS[0])} / {q.at_least(SLOW_MS[1])}", str(q.errors), f"{p.server_cores:.2f}"]


def measure(mode: Mode, work: Path) -> Result:
    phases, shares, peak = _measure(mode, work)
    base = [p for p in phases if p.big is None]
    worst = max((p for p in phases if p.big is not None and p.ack == "wal"), key=lambda p: p.probe.max_ms)
    loop_only = next(p for p in phases if p.ack == "none")
    held = max(shares, key=lambda s: s.stages[PARSE] + s.stages[PLACE])
    per_body = [("the event loop (the main thread) in all", [s.main_s / s.bodies for s in shares]),
                *((row, [s.stages[i] for s in shares]) for i, (row, _) in enumerate(STAGES)),
                ("serve's other threads (the WAL writer, the flusher), not the loop",
                 [s.other_s / s.bodies for s in shares])]
    return Result(
        scenario="big_bodies",
        headlines=[f"another client's single produce beside 32 MiB bodies: max {worst.probe.max_ms:,.0f} ms, "
                   f"p99 {worst.probe.percentile(0.99):.0f} ms ({worst.label}); alone: max "
                   f"{base[0].probe.max_ms:.0f} ms, p99 {base[0].probe.percentile(0.99):.1f} ms"],
        tables=[
            table("", ["beside", "probe ack", "bodies sent (answer)", "time per body, median", "probe req/s",
                       "probe p50", "probe p99", "probe p99.9", "probe max",
                       f"probe requests ≥ {SLOW_MS[0]} / ≥ {SLOW_MS[1]} ms", "probe errors", "server cores"],
                  [_row(p) for p in phases]),
            table("Where the event loop's time per body goes: the sampled server's CPU per body, by stage, while "
                  "bodies of each accepted kind go through one at a time with no probe.",
                  ["CPU per body, ms", *(s.big.label for s in shares)],
                  [[row, *(f"{x * 1e3:.0f}" for x in xs)] for row, xs in per_body]),
        ],
        notes=[
            f"Beside these bodies another client's request waited at most {worst.probe.max_ms:,.0f} ms "
            f"({worst.label}, ack=wal; {loop_only.probe.max_ms:,.0f} ms at ack=none, where the answer waits for the "
            f"loop alone), against {max(p.probe.max_ms for p in base):,.0f} ms alone in the same run. The longest "
            "stretch that holds the loop in one piece is the parse and the placing of the rows after it: "
            f"{(held.stages[PARSE] + held.stages[PLACE]) * 1e3:.0f} ms of CPU per body ({held.big.label}). The rest "
            "of such a wait is the same body's other stages, and the share of the two cores that goes meanwhile to "
            "everything else: the body's WAL write and flush on serve's other threads (which also take the GIL), "
            "curl, wrk and other processes on this machine.",
            *([f"serve's peak RSS over the probed rows: {peak:,.0f} MB."] if peak else []),
        ],
        figures={"phases": [p.figures() for p in phases], "peak_rss_mb": peak,
                 "loop_ms_per_body": {s.big.label: {row: xs[i] * 1e3 for row, xs in per_body}
                                      for i, s in enumerate(shares)}},
    )


SCENARIO = Scenario(
    name="big_bodies", title="Large bodies", measure=measure, timeout_s=600,
    setup="One `lakebroker serve` on 127.0.0.1 (scheduled jobs off) with a topic for the probe and one for the "
          "large bodies; then a second server, under bench.harness.sampler, for where the event loop's time goes.",
    load=f"A probe (wrk `-t1 -c1`, closed loop) sends single-message produce requests ({len(SINGLE_BODY)}-byte "
         "JSON, ack=wal) for 6 s per row: alone before and after (the same-run baseline), and in each other row "
         "while curl, one request at a time with the body from a file (at most 20 per row), sends one kind of "
         f"large body to the other topic's batch route: a JSON batch of {MAX_BATCH:,} messages (the batch limit) "
         f"near the 32 MiB body limit, an NDJSON batch of {MAX_BATCH:,} lines of the same size, and 32 MiB of "
         "newlines (refused with 422 once the body is in). One more row probes at ack=none beside the JSON "
         "batches: its answer then waits for the event loop only, not for a WAL group behind the large body's. "
         "Then 4 bodies of each accepted kind go through the sampled server one at a time, with no probe.",
    metric="The probe's latency over every request (its wrk script times each from its send to its answer; wrk's "
           "own percentiles would add samples for coordinated omission): p50, p99, p99.9, max, and the requests "
           f"of {SLOW_MS[0]} ms or more and {SLOW_MS[1]} ms or more; each large body's time from curl's start to "
           "its answer, the upload over loopback included; serve's CPU in cores. From the sampled server: the "
           "main thread's CPU per body by function, anywhere on the stack (a stage that runs in one piece holds "
           "the loop for all of its time; receiving yields between reads).",
    target="None stated as a number: the probe's max and p99 beside each body are read against the same run's "
           "baseline alone.",
)
