"""The HTTP ingest benchmarks, each beside the bare-ASGI baseline measured in the same run.

1. single-message produce (ack=wal) against concurrency, plus a decomposition at one
   connection count: bare ASGI → FastAPI floor (async and sync dependency) → ack=none → ack=wal;
2. batch produce of 100-byte values, JSON and NDJSON;
3. (bench.flush holds the in-process flusher benchmark; the in-server flush figures are read
   here from /metrics after the batch load);
4. produce → visible in Delta: a steady open-loop probe (bench.loadgen) and a table watcher
   (bench.poller), both out of process, joined on (partition, offset); on an idle server, then
   (fairness) beside a flood of batches from wrk on the same server (bench.fairness runs only this).

Load comes from wrk or bench.loadgen in their own processes; servers are on 127.0.0.1.
"""

from __future__ import annotations

import bisect
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.plan import CHECK_CONNECTIONS, Plan
from bench.procs import NO_JOBS, REPO, BenchError, Server, create_topic, lakebroker_server, metrics
from bench.wrk import LoadResult, closed_loop, have_wrk, write_script
from lakebroker.tables.layout import Layout

PRODUCE_PATH = "/v1/topics/bench/messages"
BATCH_PATH = "/v1/topics/bench/batch"
SINGLE_BODY = orjson.dumps({"value": {"id": 1234567, "event": "order_created", "amount": 42.5,
                                      "currency": "EUR", "note": "x" * 24}})
VALUE_100 = "v" * 100
FLOOD_BATCH = 1000  # messages per request of the saturating batch producer beside the probe


def batch_body(fmt: str, size: int) -> tuple[bytes, str]:
    """`json` or `ndjson`, keyless; with `-keyed`, each message keyed by one of 1,000 user ids."""
    kind, _, keyed = fmt.partition("-")
    messages = [{"key": f"user-{i % 1000}", "value": VALUE_100} if keyed else {"value": VALUE_100}
                for i in range(size)]
    if kind == "json":
        return orjson.dumps({"messages": messages}), "application/json"
    return b"\n".join(orjson.dumps(m) for m in messages) + b"\n", "application/x-ndjson"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Measured:
    """One or more closed-loop runs of one target, with the server's CPU time over them."""

    runs: list[LoadResult] = field(default_factory=list)
    cpu_s: float = 0.0

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.runs)

    @property
    def rps(self) -> float:
        duration = sum(r.duration_s for r in self.runs)
        return sum(r.requests for r in self.runs) / duration if duration else 0.0

    @property
    def ok_rps(self) -> float:
        duration = sum(r.duration_s for r in self.runs)
        return sum(r.requests - r.errors for r in self.runs) / duration if duration else 0.0

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.runs)

    @property
    def p50_ms(self) -> float:
        return percentile([r.p50_ms for r in self.runs], 0.5)

    @property
    def p99_ms(self) -> float:
        return percentile([r.p99_ms for r in self.runs], 0.5)

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_s / self.requests * 1e6 if self.requests else 0.0

    @property
    def cpu_share(self) -> float:
        """Server CPU over the runs, in cores (1.0 = one core busy all the time)."""
        duration = sum(r.duration_s for r in self.runs)
        return self.cpu_s / duration if duration else 0.0

    @property
    def command(self) -> str:
        return self.runs[0].command if self.runs else ""


def measure(server: Server, path: str, work: Path, name: str, body: bytes, content_type: str,
            connections: int, duration_s: float, into: Measured | None = None) -> Measured:
    into = into if into is not None else Measured()
    before = server.cpu()
    into.runs.append(closed_loop(server.url + path, work, name, body, content_type, connections, duration_s))
    into.cpu_s += server.cpu() - before
    server.settle()
    return into


def alternate(plan: Plan, pairs: list[tuple[Server, str]], work: Path, name: str, body: bytes,
              content_type: str, connections: int) -> list[Measured]:
    """Measure each (server, path) in turn, reversing the order every round (A-B, B-A, ...)."""
    out = [Measured() for _ in pairs]
    for k in range(plan.rounds):
        order = list(range(len(pairs)))
        if k % 2:
            order.reverse()
        for i in order:
            server, path = pairs[i]
            measure(server, path, work, f"{name}-{i}", body, content_type, connections, plan.duration_s, out[i])
    return out


# -- 1. single-message produce ----------------------------------------------------------------
@dataclass
class SinglePoint:
    connections: int
    baseline: Measured
    broker: Measured

    @property
    def ratio(self) -> float:
        return self.broker.ok_rps / self.baseline.rps if self.baseline.rps else 0.0


@dataclass
class SingleResult:
    points: list[SinglePoint]
    decomposition: list[tuple[str, Measured]]
    peak_rss_mb: float | None = None  # serve's, through the whole sweep

    def best(self) -> SinglePoint:
        return max(self.points, key=lambda p: p.broker.ok_rps)

    def checked(self) -> SinglePoint:
        """The point the target is judged at: CHECK_CONNECTIONS, or the best if the plan has none."""
        return next((p for p in self.points if p.connections == CHECK_CONNECTIONS), self.best())


def single_produce(plan: Plan, baseline: Server, floor: Server, work: Path,
                   reference: Server | None = None) -> SingleResult:
    """`reference`, if given, is the bare app under another HTTP protocol (a row of the decomposition)."""
    with lakebroker_server(work / "single-data", env=NO_JOBS) as broker:
        create_topic(broker.url, "bench")
        for server in (baseline, broker, floor):
            measure(server, PRODUCE_PATH, work, "warmup", SINGLE_BODY, "application/json", 64, plan.warmup_s)
        points = []
        for c in plan.connections:
            base, lb = alternate(plan, [(baseline, PRODUCE_PATH), (broker, PRODUCE_PATH)], work,
                                 f"single-c{c}", SINGLE_BODY, "application/json", c)
            points.append(SinglePoint(c, base, lb))
        c = plan.decomposition_connections
        at = next((p for p in points if p.connections == c), None)
        steps = [(floor, PRODUCE_PATH), (floor, "/sync" + PRODUCE_PATH), (broker, PRODUCE_PATH + "?ack=none")]
        if reference is not None:
            steps.append((reference, PRODUCE_PATH))
        measured = alternate(plan, steps, work, f"decompose-c{c}", SINGLE_BODY, "application/json", c)
        if at is None:
            base, lb = alternate(plan, [(baseline, PRODUCE_PATH), (broker, PRODUCE_PATH)], work,
                                 f"decompose-c{c}-ends", SINGLE_BODY, "application/json", c)
        else:
            base, lb = at.baseline, at.broker
        decomposition = [] if reference is None else [
            ("reference: bare ASGI under httptools instead of lakebroker's h11", measured[3])]
        decomposition += [
            ("bare ASGI (baseline)", base),
            ("FastAPI route, async dependency, no broker work", measured[0]),
            ("FastAPI route, sync dependency (as ingest_api/deps.py), no broker work", measured[1]),
            ("lakebroker produce, ack=none", measured[2]),
            ("lakebroker produce, ack=wal", lb),
        ]
        peak = broker.peak_rss_mb()
    return SingleResult(points, decomposition, peak)


# -- 2. batch produce ---------------------------------------------------------------------------
@dataclass
class BatchRow:
    fmt: str
    size: int
    body_bytes: int
    baseline: Measured
    broker: Measured

    @property
    def msg_s(self) -> float:
        return self.broker.ok_rps * self.size

    @property
    def ratio(self) -> float:
        return self.broker.ok_rps / self.baseline.rps if self.baseline.rps else 0.0


@dataclass
class BatchResult:
    rows: list[BatchRow]
    server_metrics: dict[str, float]
    load_wall_s: float
    peak_rss_mb: float | None = None  # serve's, through every body

    def best(self, keyed: bool = False) -> BatchRow | None:
        """The fastest keyless (or keyed) body, if the plan measured one."""
        rows = [r for r in self.rows if r.fmt.endswith("-keyed") == keyed]
        return max(rows, key=lambda r: r.msg_s) if rows else None


def batch_produce(plan: Plan, baseline: Server, work: Path) -> BatchResult:
    rows = []
    with lakebroker_server(work / "batch-data", env=NO_JOBS) as broker:
        create_topic(broker.url, "bench")
        body, ctype = batch_body("json", 1000)
        for server in (baseline, broker):
            measure(server, BATCH_PATH, work, "batch-warmup", body, ctype, plan.batch_connections, plan.warmup_s)
        started = time.monotonic()
        for fmt, size in plan.batch_bodies:
            body, ctype = batch_body(fmt, size)
            base, lb = alternate(plan, [(baseline, BATCH_PATH), (broker, BATCH_PATH)], work,
                                 f"batch-{fmt}-{size}", body, ctype, plan.batch_connections)
            rows.append(BatchRow(fmt, size, len(body), base, lb))
        wall = time.monotonic() - started
        deadline = time.monotonic() + 30  # let the flusher catch up before reading its totals
        while time.monotonic() < deadline and metrics(broker.url).get("lakebroker_wal_backlog_bytes", 0) > 0:
            time.sleep(0.2)
        server_metrics = metrics(broker.url)
        peak = broker.peak_rss_mb()
    return BatchResult(rows, server_metrics, wall, peak)


# -- 4. produce → visible in Delta ------------------------------------------------------------------
@dataclass
class VisibilityRun:
    label: str
    rate: float
    sent: int
    acked: int
    visible_s: list[float]  # per acked message, in due order: due time → first snapshot showing it
    ack_s: list[float]
    after_ack_s: list[float]  # ack → first snapshot showing it: the flush path alone
    not_visible: int
    rows_check: str
    polls: int
    commits: int
    background: LoadResult | None = None
    sent_to_ack_s: list[float] = field(default_factory=list)  # from the send, so without the client's queue
    commands: list[str] = field(default_factory=list)
    server_cpu_s: float = 0.0  # the server process over the probe (and flood), user + system
    peak_rss_mb: float | None = None  # serve's, from its start to the end of this run

    @property
    def flood_msg_s(self) -> float:
        return self.background.ok_rps * FLOOD_BATCH if self.background is not None else 0.0

    @property
    def cpu_us_per_message(self) -> float:
        """Server CPU per message accepted: the probe's and the flood's together."""
        messages = self.acked + (self.background.requests - self.background.errors) * FLOOD_BATCH \
            if self.background is not None else self.acked
        return self.server_cpu_s / messages * 1e6 if messages else 0.0

    def trend(self) -> tuple[float, float]:
        """Median latency of the first and of the last fifth of the run: growth means a backlog."""
        k = max(1, len(self.visible_s) // 5)
        return percentile(self.visible_s[:k], 0.5), percentile(self.visible_s[-k:], 0.5)


def _wait_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise BenchError(f"{path} did not appear in {timeout}s")
        time.sleep(0.05)


def visibility_run(plan: Plan, broker: Server, topic: str, work: Path, label: str,
                   background: bool) -> VisibilityRun:
    partitions = 3
    create_topic(broker.url, topic, partitions)
    table = Layout(Path(broker.ready_file).parent).topic_table(topic)
    seen_file, sent_file, ready = work / f"{topic}-seen.json", work / f"{topic}-sent.json", work / f"{topic}.ready"
    grace = 5.0
    poller_argv = [sys.executable, "-m", "bench.poller", "--table", table, "--partitions", str(partitions),
                   "--interval", "0.01", "--duration", str(plan.visibility_s + grace + 10), "--out", str(seen_file),
                   "--ready-file", str(ready)]
    count = int(plan.visibility_rate * plan.visibility_s)
    template = '{"value": {"seq": {seq}, "probe": "produce-to-table latency"}}'
    loadgen_argv = [sys.executable, "-m", "bench.loadgen", "--url", f"{broker.url}/v1/topics/{topic}/messages",
                    "--body-template", template, "--rate", str(plan.visibility_rate), "--connections", "8",
                    "--duration", str(plan.visibility_s), "--max-requests", str(count), "--record-body",
                    "--out", str(sent_file)]
    poller = subprocess.Popen(poller_argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bg_proc: subprocess.Popen[str] | None = None
    bg_result: LoadResult | None = None
    try:
        _wait_file(ready, 30)
        cpu_before = broker.cpu()
        if background:
            bg_proc = start_background(broker, work, plan.visibility_s + 1, plan.flood_connections)
        subprocess.run(loadgen_argv, cwd=REPO, check=True, timeout=plan.visibility_s + 60, capture_output=True)
        if bg_proc is not None:
            bg_result = finish_background(bg_proc, plan.visibility_s + 1, plan.flood_connections)
        cpu_s = broker.cpu() - cpu_before
        # The probe is done; stop watching once every acked offset is visible or the grace ends.
        sent = orjson.loads(sent_file.read_bytes())["samples"]
        need = {}
        for s in sent:
            if s[3] == 200 and s[5] is not None:
                need[s[4]] = max(need.get(s[4], -1), s[5])
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            ends = _committed_ends(broker.url, topic, partitions)
            if all(ends.get(p, 0) > o for p, o in need.items()):
                break
            time.sleep(0.05)
        time.sleep(0.1)
        poller.terminate()  # SIGTERM: the poller writes its file and exits
        poller.wait(timeout=60)
    finally:
        if poller.poll() is None:
            poller.kill()
            poller.wait()
        if bg_proc is not None and bg_proc.poll() is None:
            bg_proc.kill()
            bg_proc.wait()
    _wait_file(seen_file, 10)
    seen = orjson.loads(seen_file.read_bytes())
    run = join_visibility(label, plan.visibility_rate, sent, seen, partitions)
    run.background = bg_result
    run.server_cpu_s = cpu_s
    run.commands = [" ".join(a[1:]).replace(str(REPO) + "/", "").replace(str(work), "$WORK")
                    for a in (loadgen_argv, poller_argv)]
    return run


def _committed_ends(url: str, topic: str, partitions: int) -> dict[int, int]:
    m = metrics(url)
    return {p: int(m.get(f'lakebroker_partition_committed_offset{{partition="{p}",topic="{topic}"}}', 0))
            for p in range(partitions)}


def join_visibility(label: str, rate: float, sent: list[list[Any]], seen: dict[str, Any],
                    partitions: int) -> VisibilityRun:
    times: dict[int, list[float]] = {p: [] for p in range(partitions)}
    ends: dict[int, list[int]] = {p: [] for p in range(partitions)}
    for t, p, end in seen["changes"]:
        times[p].append(t)
        ends[p].append(end)
    visible: list[tuple[float, float]] = []
    acks, after_ack, missing, acked = [], [], 0, 0
    served = []
    for due, sent_at, done, status, p, offset in sent:
        if status != 200 or p is None or offset is None:
            continue
        acked += 1
        acks.append(done - due)
        served.append(done - sent_at)
        i = bisect.bisect_right(ends[p], offset)  # the first snapshot whose log-end is past the offset
        if i < len(ends[p]):
            visible.append((due, times[p][i] - due))
            after_ack.append(times[p][i] - done)
        else:
            missing += 1
    problems = [f"partition {p}: {n} rows for offsets {lo}..{hi}" for p, (n, lo, hi) in seen["present"].items()
                if n and n != hi - lo + 1]
    rows_check = "rows present and dense in every partition" if not problems else "; ".join(problems)
    return VisibilityRun(label, rate, len(sent), acked, [v for _, v in sorted(visible)], acks, after_ack, missing,
                         rows_check, seen["polls"], len(seen["changes"]), sent_to_ack_s=served)


def start_background(broker: Server, work: Path, duration_s: float, connections: int) -> subprocess.Popen[str]:
    """A saturating batch producer beside the probe: wrk's closed loop of 1,000-message JSON batches."""
    body, ctype = batch_body("json", FLOOD_BATCH)
    script = write_script(work, "background", body, ctype)
    url = broker.url + "/v1/topics/background/batch"
    create_topic(broker.url, "background")
    if have_wrk():
        argv = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration_s))}s", "--timeout", "10s",
                "-s", str(script), url]
    else:
        argv = [sys.executable, "-m", "bench.loadgen", "--url", url, "--body-file", str(work / "background.body"),
                "--content-type", ctype, "--connections", str(connections), "--duration", str(duration_s),
                "--max-requests", "1000000", "--summary-only", "--out", str(work / "background.json")]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_background(proc: subprocess.Popen[str], duration_s: float, connections: int) -> LoadResult | None:
    out, _ = proc.communicate(timeout=duration_s + 60)
    line = next((ln for ln in out.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        return None
    r = orjson.loads(line[len("WRKJSON "):])
    return LoadResult("wrk", " ".join(str(a) for a in proc.args), connections, r["requests"], r["duration_us"] / 1e6,
                      r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"],
                      r["p50_us"] / 1e3, r["p90_us"] / 1e3, r["p99_us"] / 1e3)


def produce_to_table(plan: Plan, work: Path) -> list[VisibilityRun]:
    runs = []
    with lakebroker_server(work / "visibility-data", env=NO_JOBS) as broker:
        runs.append(visibility_run(plan, broker, "latency", work, "idle server", background=False))
        runs[-1].peak_rss_mb = broker.peak_rss_mb()
        if plan.visibility_under_load:
            runs.append(visibility_run(plan, broker, "latency-loaded", work,
                                       "beside a saturating batch producer", background=True))
            runs[-1].peak_rss_mb = broker.peak_rss_mb()
    return runs
