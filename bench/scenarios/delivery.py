"""Webhook delivery: produce→webhook latency at the defaults, ordered delivery's rate per partition,
one worker's throughput beside the bare receiver's own request rate, and nothing lost to a faulty receiver.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.harness import plots
from bench.harness.compare import percentile
from bench.harness.memory import RssSampler, children
from bench.harness.servers import BenchError, Server, cpu_seconds, create_topic, lakebroker_server
from bench.harness.wrk import closed_loop
from bench.result import REPO, Check, Image, Mode, Result, Scenario, table

DEFAULT_ENV = {"LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1"}  # the receiver is on loopback; nothing else is set
FAST_ENV = {"LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1", "LAKEBROKER_DELIVER_IN_SERVE": "0",
            "LAKEBROKER_HEARTBEAT_S": "0.5", "LAKEBROKER_FLUSH_INTERVAL_MS": "100"}
PARTITIONS = 4
P50_MS, P99_MS, ORDERED_MSG_S = 300, 1_000, {1: 2_500, 4: 1_000}  # the targets (ordered: by partitions)
LATENCY_RUNS = {"full": 3, "quick": 1, "tiny": 1}  # the check reads the run of median p99
LATENCY_S = {"full": 20, "quick": 8, "tiny": 3}
ORDERED_PARTITIONS: dict[str, tuple[int, ...]] = {"full": (1, PARTITIONS), "quick": (1,), "tiny": (1,)}
ORDERED_N = {"full": 20_000, "quick": 4_000, "tiny": 1_000}
THROUGHPUT_N, FAULTY_N = 40_000, 5_000  # full mode only
CDF = plots.IMG_DIR / "produce_to_webhook_cdf.png"  # written in full mode only


def receiver(work: Path, name: str, *flags: str) -> Server:
    ready = work / f"{name}.json"
    argv = [sys.executable, "-m", "bench.harness.receiver_app", "--ready-file", str(ready), *flags]
    return Server(name=name, argv=argv, ready_file=ready, log=work / f"{name}.log")


def worker(data: Path, name: str) -> subprocess.Popen[bytes]:
    log = (data.parent / f"{name}.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "deliver",
                             "--worker-id", name], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                            env={**os.environ, **FAST_ENV})


def stats(url: str) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(url + "/stats", timeout=60).json()
    return out


def subscribe(url: str, receiver_url: str, **extra: Any) -> None:
    body = {"name": "bench", "topic": "bench", "url": receiver_url + "/hook", "start": "earliest", **extra}
    r = httpx.post(url + "/v1/subscriptions", json=body, timeout=30)
    if r.status_code != 201:
        raise BenchError(f"subscription failed: {r.text}")


def fill(url: str, n: int) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        for start in range(0, n, 5000):
            count = min(5000, n - start)
            c.post("/v1/topics/bench/batch?ack=table",
                   json={"messages": [{"value": "x" * 90} for _ in range(count)]}).raise_for_status()


def wait_until(predicate: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise BenchError(f"{what}: not done in {timeout}s")
        time.sleep(0.1)
    return time.monotonic() - started


def throughput(work: Path, n: int, batch_size: int) -> tuple[float, float, float]:
    """Messages per second one worker process delivers once running (first to last arrival at
    the receiver), the same over the whole run including the worker's start-up, and the bare
    receiver's own rate."""
    data = work / f"tp-{batch_size}"
    with lakebroker_server(data, env=FAST_ENV) as broker, receiver(work, f"fast-{batch_size}") as sink:
        create_topic(broker.url, "bench", PARTITIONS)
        fill(broker.url, n)
        subscribe(broker.url, sink.url, ordering="none", max_in_flight=64, batch_size=batch_size)
        proc = worker(data, f"tp-worker-{batch_size}")
        try:
            seconds = wait_until(lambda: len(stats(sink.url)["got"]) >= n, 600, "throughput run")
            arrivals = sorted(arrived for _, _, _, arrived, _ in stats(sink.url)["got"])
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        envelope = orjson.dumps({"topic": "bench", "partition": 0, "offset": 0, "timestamp": "x", "value": "x" * 90})
        base = closed_loop(sink.url + "/hook", work, f"receiver-{batch_size}", envelope, "application/json", 16, 5)
    steady = (len(arrivals) - 1) / max(1e-9, arrivals[-1] - arrivals[0])
    return steady, n / seconds, base.ok_rps


@dataclass
class LatencyRun:
    sent_ms: list[float]  # producer's send → webhook arrival, sorted
    append_ms: list[float]  # log-append time → webhook arrival, sorted
    offered: int
    seconds: float
    late_ticks: int
    duplicates: int
    serve_rss_mb: float
    child_rss_mb: float
    serve_cpu_us: float  # CPU per message while the load ran and drained
    child_cpu_us: float


def owned(url: str) -> bool:
    status = httpx.get(url + "/v1/subscriptions/bench", timeout=30).json()
    return all(p["owner"] for p in status["partitions"])


def latency(work: Path, seconds: float, name: str = "latency", env: dict[str, str] | None = None,
            **subscription: Any) -> LatencyRun:
    """Produce→webhook at the defaults (issue 11): one `serve` with nothing configured but the
    loopback receiver allowed, 4 partitions, a subscription with default settings, and an
    out-of-process producer sending batches of 20 every 10 ms (2,000 msg/s) over 50 keys."""
    data = work / name
    with lakebroker_server(data, env={**DEFAULT_ENV, **(env or {})}) as broker, receiver(work, f"{name}-sink") as sink:
        create_topic(broker.url, "bench", PARTITIONS)
        subscribe(broker.url, sink.url, **subscription)
        wait_until(lambda: owned(broker.url), 120, "delivery takes its partitions")
        child = children(broker.pid)
        cpu = cpu_seconds(broker.pid), sum(cpu_seconds(c) for c in child)
        with RssSampler(broker.pid) as rss:
            out = subprocess.run([sys.executable, "-m", "bench.harness.steady_producer", "--url", broker.url, "--topic",
                                  "bench", "--rate", "2000", "--seconds", str(seconds), "--keys", "50"], cwd=REPO,
                                 capture_output=True, text=True, timeout=seconds + 60, check=True)
            produced = orjson.loads(out.stdout)
            wait_until(lambda: len({(p, o) for p, o, *_ in stats(sink.url)["got"]}) >= produced["sent"], 120,
                       "latency run")
        used = cpu_seconds(broker.pid) - cpu[0], sum(cpu_seconds(c) for c in child) - cpu[1]
        got = stats(sink.url)["got"]
    first: dict[tuple[int, int], tuple[str, float, float]] = {}
    for p, o, ts, arrived, sent in got:
        first.setdefault((p, o), (ts, arrived, sent))  # a redelivery does not count twice
    return LatencyRun(
        sent_ms=sorted((arrived - sent) * 1000 for _, arrived, sent in first.values()),
        append_ms=sorted((arrived - datetime.fromisoformat(ts).timestamp()) * 1000
                         for ts, arrived, _ in first.values()),
        offered=produced["sent"], seconds=produced["seconds"], late_ticks=produced["late_ticks"],
        duplicates=len(got) - len(first), serve_rss_mb=rss.peak_mb, child_rss_mb=rss.peak_children_mb,
        serve_cpu_us=used[0] * 1e6 / max(1, len(first)), child_cpu_us=used[1] * 1e6 / max(1, len(first)))


@dataclass
class OrderedRate:
    partitions: int
    per_partition: list[float]  # msg/s of each partition, first to last arrival
    child_cpu_us: float


def partition_rate(work: Path, n: int, partitions: int) -> OrderedRate:
    """ordering=partition at 1 message per POST (one POST in flight per partition) to a fast
    loopback receiver, from serve's own delivery process: each partition's rate once it runs."""
    name = f"ordered-{partitions}"
    with lakebroker_server(work / name, env=DEFAULT_ENV) as broker, receiver(work, f"{name}-sink") as sink:
        create_topic(broker.url, "bench", partitions)
        fill(broker.url, n)  # keyless: spread over the partitions
        child = children(broker.pid)
        before = sum(cpu_seconds(c) for c in child)
        subscribe(broker.url, sink.url, ordering="partition")
        wait_until(lambda: len({(p, o) for p, o, *_ in stats(sink.url)["got"]}) >= n, 600, "ordered run")
        used = sum(cpu_seconds(c) for c in child) - before
        arrivals: dict[int, list[float]] = {}
        for p, _, _, arrived, _ in stats(sink.url)["got"]:
            arrivals.setdefault(p, []).append(arrived)
    rates = [(len(a) - 1) / max(1e-9, max(a) - min(a)) for a in arrivals.values()]
    return OrderedRate(partitions, sorted(rates), used * 1e6 / n)


def faulty(work: Path, n: int) -> dict[str, Any]:
    """A receiver failing 30 %, throttling 5 % with Retry-After and hanging 5 %: nothing is lost."""
    data = work / "faulty"
    with lakebroker_server(data, env=FAST_ENV) as broker, receiver(
        work, "faulty-sink", "--fail", "0.3", "--throttle", "0.05", "--hang", "0.05", "--hang-s", "2"
    ) as sink:
        create_topic(broker.url, "bench", PARTITIONS)
        fill(broker.url, n)
        subscribe(broker.url, sink.url, ordering="none", max_in_flight=32, max_attempts=4,
                  retry_schedule_s=[0.05, 0.1, 0.2], timeout_s=0.5)
        proc = worker(data, "faulty-worker")

        def settled() -> bool:
            status = httpx.get(broker.url + "/v1/subscriptions/bench", timeout=30).json()
            return all(p["lag"] == 0 for p in status["partitions"])

        try:
            seconds = wait_until(settled, 600, "faulty run")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        delivered = {(p, o) for p, o, *_ in stats(sink.url)["got"]}
        letters = httpx.get(broker.url + "/v1/subscriptions/bench/dead-letters?limit=10000", timeout=30).json()
        dead = {(d["partition"], d["offset"]) for d in letters["dead_letters"]}
        answers = stats(sink.url)["answers"]
        ends = httpx.get(broker.url + "/v1/topics/bench", timeout=30).json()["partition_offsets"]
    expected = {(e["partition"], o) for e in ends for o in range(e["high_watermark"])}
    return {"messages": len(expected), "seconds": seconds, "delivered": len(delivered & expected),
            "dead_lettered": len((dead - delivered) & expected), "lost": len(expected - delivered - dead),
            "answers": answers}


def measure(mode: Mode, work: Path) -> Result:
    lats = [latency(work, LATENCY_S[mode], name=f"latency-{i}") for i in range(LATENCY_RUNS[mode])]
    ordered = [partition_rate(work, ORDERED_N[mode], p) for p in ORDERED_PARTITIONS[mode]]
    middle = sorted(lats, key=lambda r: percentile(r.sent_ms, 0.99))[len(lats) // 2]
    p50, p99 = percentile(middle.sent_ms, 0.5), percentile(middle.sent_ms, 0.99)
    of_runs = f"the run of median p99 of {len(lats)}" if len(lats) > 1 else "one run"
    result = Result(
        scenario="delivery",
        checks=[Check("produce→webhook p50 at the defaults, 2,000 msg/s", p50, "ms", P50_MS, higher_is_better=False),
                Check("produce→webhook p99 at the defaults, 2,000 msg/s", p99, "ms", P99_MS, higher_is_better=False),
                *[Check(f"ordering=partition on {r.partitions} partition(s): the slowest partition's rate",
                        min(r.per_partition), "msg/s", ORDERED_MSG_S[r.partitions]) for r in ordered]],
        headlines=[f"produce→webhook at the defaults, 2,000 msg/s: p50 {p50:.0f} ms, p99 {p99:.0f} ms "
                   f"(targets {P50_MS} / {P99_MS:,} ms)"],
        tables=[
            table("Produce→webhook at the defaults (2,000 msg/s over 50 keys). CPU per delivered message while the "
                  "load ran and drained; RSS the peak of each process.",
                  ["run", "messages sent", "producer ticks late", "p50 ms", "p99 ms", "from log-append p50 / p99 ms",
                   "serve CPU µs", "delivery process CPU µs", "serve peak RSS MB", "delivery peak RSS MB"],
                  [[i + 1, f"{r.offered:,} in {r.seconds:.0f} s", r.late_ticks, f"{percentile(r.sent_ms, 0.5):.0f}",
                    f"{percentile(r.sent_ms, 0.99):.0f}",
                    f"{percentile(r.append_ms, 0.5):.0f} / {percentile(r.append_ms, 0.99):.0f}",
                    f"{r.serve_cpu_us:.0f}", f"{r.child_cpu_us:.0f}", f"{r.serve_rss_mb:.0f}",
                    f"{r.child_rss_mb:.0f}"] for i, r in enumerate(lats)]),
            table("ordering=partition, 1 message per POST, from serve's delivery process: each partition's rate from "
                  "its first to its last arrival.",
                  ["partitions", "messages", "slowest partition msg/s", "each partition msg/s",
                   "delivery process CPU µs per message"],
                  [[r.partitions, f"{ORDERED_N[mode]:,}", f"{min(r.per_partition):,.0f}",
                    ", ".join(f"{x:,.0f}" for x in r.per_partition), f"{r.child_cpu_us:.0f}"] for r in ordered]),
        ],
        figures={"latency": [{k: v for k, v in vars(r).items() if k not in ("sent_ms", "append_ms")}
                             | {"p50_ms": percentile(r.sent_ms, 0.5), "p99_ms": percentile(r.sent_ms, 0.99)}
                             for r in lats],
                 "ordered": [vars(r) for r in ordered]},
    )
    app50, app99 = percentile(middle.append_ms, 0.5), percentile(middle.append_ms, 0.99)
    result.notes.append(f"In {of_runs}, half the messages reached the webhook within {p50:.0f} ms of the producer's "
                        f"send and 99 % within {p99:.0f} ms; counted from the log append instead, p50 {app50:.0f} ms "
                        f"and p99 {app99:.0f} ms.")
    if mode == "full":
        plots.webhook_cdf(middle.sent_ms, CDF)
        result.images.append(Image(f"produce→webhook latency CDF ({of_runs})", f"img/{CDF.name}"))
        _throughput_and_faults(work, result)
    return result


def _throughput_and_faults(work: Path, result: Result) -> None:
    runs = [(size, *throughput(work, THROUGHPUT_N, size)) for size in (1, 100)]
    fault = faulty(work, FAULTY_N)
    result.checks.append(Check("faulty receiver: messages neither delivered nor dead-lettered", fault["lost"],
                               "messages", 0, higher_is_better=False))
    result.tables += [
        table("One `lakebroker deliver` process (serve's delivery off), ordering none, 64 in flight, beside the bare "
              "receiver's own rate under wrk (16 connections) in the same run.",
              ["batch_size", "messages", "msg/s, first to last arrival", "msg/s with the worker's start-up",
               "bare receiver req/s", "ratio"],
              [[size, f"{THROUGHPUT_N:,}", f"{steady:,.0f}", f"{whole:,.0f}", f"{base:,.0f}", f"{steady / base:.2f}"]
               for size, steady, whole, base in runs]),
        table("A faulty receiver (30 % 500, 5 % 429 with Retry-After: 1, 5 % hanging past a 0.5 s timeout), "
              "max_attempts 4.",
              ["messages", "delivered", "dead-lettered", "lost", "seconds", "receiver answers"],
              [[f"{fault['messages']:,}", f"{fault['delivered']:,}", f"{fault['dead_lettered']:,}", fault["lost"],
                f"{fault['seconds']:.1f}", ", ".join(f"{k}: {v:,}" for k, v in sorted(fault["answers"].items()))]]),
    ]
    (_, one, _, base1), (_, hundred, _, base100) = runs
    result.notes.append(f"One worker delivering one message per POST reaches {one / base1:.2f}x the bare receiver's "
                        f"request rate ({one:,.0f} msg/s); with batch_size 100 it delivers {hundred:,.0f} msg/s, "
                        f"{hundred / base100:.2f}x the receiver's request rate, since each POST carries up to 100.")
    result.figures.update(throughput=[dict(zip(("batch_size", "msg_s", "msg_s_with_start", "receiver_rps"), r,
                                               strict=True)) for r in runs], faulty=fault)


SCENARIO = Scenario(
    name="delivery", title="Webhook delivery", measure=measure,
    setup="`lakebroker serve` with nothing configured but `LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS=1` (the receiver is on "
          f"loopback), so delivery is serve's own child process; {PARTITIONS} partitions; a uvicorn receiver process "
          "on 127.0.0.1. For throughput and the faulty receiver, serve's delivery is off and one `lakebroker deliver` "
          "process delivers.",
    load="Latency: a subscription with default settings (ordering `key`, up to 16 in flight) and a producer process "
         "(`bench.harness.steady_producer`) sending a batch of 20 every 10 ms (2,000 msg/s) over 50 keys with "
         "ack=wal, 20 s, three runs. Ordered: 20,000 keyless messages already in the table, ordering `partition`, one "
         "message per POST, on 1 and on 4 partitions. Throughput: 40,000 messages already in the table, ordering "
         "`none`, 64 in flight, batch_size 1 and 100. Faults: 5,000 messages to a receiver failing 30 %, throttling "
         "5 % and hanging 5 %, max_attempts 4. The quick run: one 8 s latency run and 4,000 ordered messages on one "
         "partition.",
    metric="Latency from the producer's send time (carried in each message) to the webhook's arrival, first "
           "deliveries only, checked in the run whose p99 is the median of the three; each partition's rate from "
           "its first to its last arrival; messages per second against the bare receiver's own request rate under "
           "wrk; every offset delivered or dead-lettered.",
    target=f"p50 ≤ {P50_MS} ms and p99 ≤ {P99_MS:,} ms at the defaults; with ordering=partition ≥ {ORDERED_MSG_S[1]:,} "
           f"msg/s on one partition and ≥ {ORDERED_MSG_S[4]:,} on each of four; nothing lost to a faulty receiver.",
    timeout_s=1800,
)
