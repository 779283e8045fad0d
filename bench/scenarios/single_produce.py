"""Single-message produce at ack=wal against a bare ASGI app under the same server settings, over a sweep of
connection counts, and where the time goes (the same request against servers that do less and less)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.harness import plots
from bench.harness.baseline_app import uvicorn_settings
from bench.harness.compare import Measured, alternate, measure
from bench.harness.servers import NO_JOBS, Server, baseline_server, create_topic, lakebroker_server
from bench.result import Check, Image, Mode, Result, Scenario, table

TARGET_RATIO = 0.5  # of the bare ASGI app's req/s, judged at CHECK_CONNECTIONS (`wrk -t1 -c32`)
CHECK_CONNECTIONS = 32
TARGET_RSS_MB = 300  # serve's peak resident memory (the same target in every ingest scenario)
PRODUCE_PATH = "/v1/topics/bench/messages"
SINGLE_BODY = orjson.dumps({"value": {"id": 1234567, "event": "order_created", "amount": 42.5,
                                      "currency": "EUR", "note": "x" * 24}})


@dataclass(frozen=True)
class Sizes:
    duration_s: float  # each closed-loop measurement
    warmup_s: float
    rounds: int  # baseline and broker alternate, A-B then B-A
    connections: tuple[int, ...]
    decomposition_connections: int


SIZES = {
    "full": Sizes(10, 3, 2, (1, 4, 16, 32, 64, 128, 256), 64),
    "quick": Sizes(2, 1, 1, (1, 32, 64, 256), 64),
    "tiny": Sizes(1, 0.5, 1, (8,), 8),
}


def _serves_h11() -> bool:
    http = uvicorn_settings().get("http", "auto")
    name = http if isinstance(http, str) else getattr(http, "__module__", "") + "." + getattr(http, "__name__", "")
    return "h11" in name.lower()


def _sweep(sz: Sizes, base: Server, floor: Server, reference: Server | None, work: Path) -> Result:
    with lakebroker_server(work / "single-data", env=NO_JOBS) as broker:
        create_topic(broker.url, "bench")
        for server in (base, broker, floor):
            measure(server, PRODUCE_PATH, work, "warmup", SINGLE_BODY, "application/json", 64, sz.warmup_s)
        points: dict[int, tuple[Measured, Measured]] = {}
        for c in sz.connections:
            b, lb = alternate(sz.rounds, sz.duration_s, [(base, PRODUCE_PATH), (broker, PRODUCE_PATH)], work,
                              f"single-c{c}", SINGLE_BODY, "application/json", c)
            points[c] = (b, lb)
        c = sz.decomposition_connections
        steps = [(floor, PRODUCE_PATH), (floor, "/sync" + PRODUCE_PATH), (broker, PRODUCE_PATH + "?ack=none")]
        if reference is not None:
            steps.append((reference, PRODUCE_PATH))
        parts = alternate(sz.rounds, sz.duration_s, steps, work, f"decompose-c{c}", SINGLE_BODY,
                          "application/json", c)
        ends = points.get(c) or tuple(alternate(sz.rounds, sz.duration_s, [(base, PRODUCE_PATH),
                                                                           (broker, PRODUCE_PATH)],
                                                work, f"decompose-c{c}-ends", SINGLE_BODY, "application/json", c))
        peak = broker.peak_rss_mb()
    decomposition = [("reference: bare ASGI under httptools instead of lakebroker's h11", parts[3])] \
        if reference is not None else []
    decomposition += [
        ("bare ASGI (baseline)", ends[0]),
        ("FastAPI route, async dependency, no broker work", parts[0]),
        ("FastAPI route, sync dependency (as ingest_api/deps.py), no broker work", parts[1]),
        ("lakebroker produce, ack=none", parts[2]),
        ("lakebroker produce, ack=wal", ends[1]),
    ]
    return _result(sz, points, decomposition, peak)


def _result(sz: Sizes, points: dict[int, tuple[Measured, Measured]], decomposition: list[tuple[str, Measured]],
            peak_mb: float | None) -> Result:
    def ratio(c: int) -> float:
        b, lb = points[c]
        return lb.ok_rps / b.rps if b.rps else 0.0

    checked = CHECK_CONNECTIONS if CHECK_CONNECTIONS in points else max(points, key=lambda c: points[c][1].ok_rps)
    base_at, broker_at = points[checked]
    checks = [Check(f"msg/s over bare ASGI req/s at {checked} connections", ratio(checked), "x", TARGET_RATIO,
                    baseline=f"bare ASGI {base_at.rps:,.0f} req/s; lakebroker {broker_at.ok_rps:,.0f} msg/s, "
                             f"{broker_at.cpu_us_per_request:,.0f} µs of server CPU per message")]
    if peak_mb is not None:
        checks.append(Check("serve's peak RSS", peak_mb, "MB", TARGET_RSS_MB, higher_is_better=False))
    base_row = next(m for label, m in decomposition if label.startswith("bare ASGI (baseline)"))
    return Result(
        scenario="single_produce", checks=checks,
        headlines=[f"{broker_at.ok_rps:,.0f} msg/s at {checked} connections, {ratio(checked):.2f}x bare ASGI"],
        tables=[
            table("The sweep: baseline and lakebroker alternate at each connection count.",
                  ["connections", "baseline req/s", "baseline CPU µs/req", "lakebroker msg/s", "ratio", "p50 ms",
                   "p99 ms", "lakebroker CPU µs/msg", "server cores", "errors"],
                  [[c, f"{b.rps:,.0f}", f"{b.cpu_us_per_request:,.0f}", f"{lb.ok_rps:,.0f}", f"{ratio(c):.2f}",
                    f"{lb.p50_ms:.1f}", f"{lb.p99_ms:.1f}", f"{lb.cpu_us_per_request:,.0f}", f"{lb.cpu_share:.2f}",
                    lb.errors] for c, (b, lb) in points.items()]),
            table(f"Where the time goes, at {sz.decomposition_connections} connections: the same request against "
                  "servers that do less and less of the work.",
                  ["server", "msg/s", "req/s", "p50 ms", "p99 ms", "server CPU µs/msg", "server cores", "errors",
                   "ratio to baseline"],
                  [[label, *m.row(), f"{m.ok_rps / base_row.rps:.2f}" if base_row.rps else "0"]
                   for label, m in decomposition]),
        ],
        figures={"points": {str(c): {"baseline_rps": b.rps, "broker_ok_rps": lb.ok_rps, "broker_cpu_s": lb.cpu_s,
                                "broker_p99_ms": lb.p99_ms} for c, (b, lb) in points.items()},
                 "decomposition": {label: m.ok_rps for label, m in decomposition}, "peak_rss_mb": peak_mb,
                 "command": broker_at.command},
    )


def run(mode: Mode, work: Path) -> Result:
    sz = SIZES[mode]
    base, floor = baseline_server(work, "bare"), baseline_server(work, "fastapi")
    reference = baseline_server(work, "bare", http="httptools") if _serves_h11() else None
    helpers = [s for s in (base, floor, reference) if s is not None]
    try:
        for server in helpers:
            server.launch()
        for server in helpers:
            server.wait_ready()
        result = _sweep(sz, base, floor, reference, work)
    finally:
        for server in helpers:
            server.stop()
    if mode == "full":
        points = result.figures["points"]
        path = plots.IMG_DIR / "produce_throughput.png"
        plots.throughput([int(c) for c in points], [p["baseline_rps"] for p in points.values()],
                         [p["broker_ok_rps"] for p in points.values()], TARGET_RATIO, path)
        result.images.append(Image("throughput against concurrency", "img/produce_throughput.png"))
    return result


SCENARIO = Scenario(
    name="single_produce", title="Single-message produce", measure=run,
    setup="`lakebroker serve` at its defaults on 127.0.0.1, scheduled Spark jobs off (a job's JVM would share the "
          "cores with the load), one topic of 3 partitions; beside it the baseline, a bare ASGI app answering a "
          "fixed JSON under the same uvicorn settings, and a FastAPI app with the broker's route shape but no "
          "broker work.",
    load=f"wrk `-t1`, closed loop, `POST {PRODUCE_PATH}` with a {len(SINGLE_BODY)}-byte JSON body, keyless, "
         "ack=wal (answered after the WAL group commit's fdatasync); 1 to 256 connections, 10 s per point, the "
         "baseline and lakebroker alternating A-B then B-A.",
    metric="lakebroker's acknowledged messages per second over the baseline's requests per second at the same "
           "concurrency; server CPU per message; serve's peak RSS over the sweep.",
    target=f"≥ {TARGET_RATIO:g}x the bare ASGI app at {CHECK_CONNECTIONS} connections "
           f"(`wrk -t1 -c{CHECK_CONNECTIONS}`); serve's peak RSS ≤ {TARGET_RSS_MB} MB.",
)
