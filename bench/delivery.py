"""Delivery benchmarks: throughput per worker, produce→webhook latency, and a faulty receiver.

Each figure sits beside a baseline from the same run: the bare receiver's own request rate
under wrk, so "delivery throughput" reads as a share of what the receiver can take at all.

`python -m bench.delivery [--quick]` prints the markdown fragment; bench.run calls `run`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.memory import RssSampler, children
from bench.procs import REPO, BenchError, Server, cpu_seconds, create_topic, lakebroker_server
from bench.wrk import closed_loop

DEFAULT_ENV = {"LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1"}  # the receiver is on loopback; nothing else is set
FAST_ENV = {"LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1", "LAKEBROKER_DELIVER_IN_SERVE": "0",
            "LAKEBROKER_HEARTBEAT_S": "0.5", "LAKEBROKER_FLUSH_INTERVAL_MS": "100"}
PARTITIONS = 4


def receiver(work: Path, name: str, *flags: str) -> Server:
    ready = work / f"{name}.json"
    return Server(name=name, argv=[sys.executable, "-m", "bench.receiver_app", "--ready-file", str(ready), *flags],
                  ready_file=ready, log=work / f"{name}.log")


def worker(data: Path, name: str) -> subprocess.Popen[bytes]:
    log = (data.parent / f"{name}.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "deliver",
                             "--worker-id", name], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                            env={**__import__("os").environ, **FAST_ENV})


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
            out = subprocess.run([sys.executable, "-m", "bench.steady_producer", "--url", broker.url, "--topic",
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
    expected = {(e["partition"], o) for e in ends for o in range(e["committed_offset"])}
    return {"messages": len(expected), "seconds": seconds, "delivered": len(delivered & expected),
            "dead_lettered": len((dead - delivered) & expected), "lost": len(expected - delivered - dead),
            "answers": answers}


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def plot_cdf(latencies_ms: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(latencies_ms, [i / len(latencies_ms) for i in range(len(latencies_ms))])
    ax.set_xlabel("produce → webhook latency (ms)")
    ax.set_ylabel("fraction of messages")
    ax.set_title("Produce → webhook at 2,000 msg/s")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency_row(label: str, r: LatencyRun) -> str:
    sent, app = r.sent_ms, r.append_ms
    return (f"| {label} ({r.offered:,} messages in {r.seconds:.0f} s, {r.late_ticks} producer ticks late) "
            f"| p50 **{percentile(sent, 0.5):.0f} ms**, p99 **{percentile(sent, 0.99):.0f} ms** "
            f"(from log-append: p50 {percentile(app, 0.5):.0f}, p99 {percentile(app, 0.99):.0f}) "
            f"| p50 ≤ 300 ms, p99 ≤ 1,000 ms | serve {r.serve_cpu_us:.0f} µs + delivery process "
            f"{r.child_cpu_us:.0f} µs; RSS serve {r.serve_rss_mb:.0f} MB, delivery {r.child_rss_mb:.0f} MB |")


def _ordered_row(r: OrderedRate, n: int) -> str:
    rates = ", ".join(f"{x:,.0f}" for x in r.per_partition)
    return (f"| ordering=partition, 1 message per POST, {r.partitions} partition(s), {n:,} messages "
            f"| {min(r.per_partition):,.0f} msg/s per partition (each: {rates}) | ≥ 1,000 msg/s per partition "
            f"| delivery process {r.child_cpu_us:.0f} µs |")


def run(quick: bool) -> str:
    """quick: the defaults' latency once and ordered delivery on one partition; full: latency three
    times, ordered delivery on 1 and 4 partitions, throughput and the faulty receiver."""
    n = 5_000 if quick else 40_000
    ordered_n = 4_000 if quick else 20_000
    with tempfile.TemporaryDirectory(prefix="lakebroker-bench-delivery-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        lats = [latency(work, 8 if quick else 20, name=f"latency-{i}") for i in range(1 if quick else 3)]
        ordered = [partition_rate(work, ordered_n, p) for p in ((1,) if quick else (1, PARTITIONS))]
        if not quick:
            single, single_all, base1 = throughput(work, n, 1)
            batched, batched_all, base100 = throughput(work, n, 100)
            fault = faulty(work, 5_000)
    middle = sorted(lats, key=lambda r: percentile(r.sent_ms, 0.99))[len(lats) // 2]
    plot_cdf(middle.sent_ms, REPO / "docs" / "img" / "produce_to_webhook_cdf.png")
    p50, p99 = percentile(middle.sent_ms, 0.5), percentile(middle.sent_ms, 0.99)
    lines = [
        "## Delivery",
        "",
        f"Command: `python -m bench.delivery{' --quick' if quick else ''}` (also run by `make bench`"
        f"{'' if not quick else ' and, this short form, by `make bench-quick`'}). Produce→webhook at the defaults: "
        f"one `lakebroker serve` with nothing configured but `LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS=1` (the receiver is "
        f"on loopback), so delivery is serve's own child process; {PARTITIONS} partitions; a subscription with "
        "default settings (ordering `key`, up to 16 in flight); a producer process (`bench.steady_producer`) "
        "sending a batch of 20 messages every 10 ms (2,000 msg/s) over 50 keys with ack=wal; a uvicorn receiver "
        "process on 127.0.0.1. Latency runs from the producer's send time (in each message) to the webhook's "
        "arrival; the log-append time is the other start shown. CPU is per delivered message while the load "
        "ran and drained; RSS is the peak of each process.",
        "",
        f"<!-- headline: produce→webhook at the defaults, 2,000 msg/s: p50 {p50:.0f} ms, p99 {p99:.0f} ms "
        f"(targets 300 / 1,000 ms) -->",
        "",
        "| figure | value | target | server CPU per message, memory |",
        "|---|---|---|---|",
        *[_latency_row(f"produce→webhook at the defaults, run {i + 1}", r) for i, r in enumerate(lats)],
        *[_ordered_row(r, ordered_n) for r in ordered],
    ]
    if not quick:
        lines += [
            "",
            "Throughput and faults: one `lakebroker deliver` process (serve's delivery off), counted from the first "
            "to the last arrival at the receiver and also over the whole run, beside the bare receiver's own rate.",
            "",
            "| figure | value | baseline in the same run | ratio |",
            "|---|---|---|---|",
            f"| delivery, 1 message per POST, ordering none, 64 in flight ({n:,} messages) | {single:,.0f} msg/s "
            f"({single_all:,.0f} msg/s counting the worker's start-up) "
            f"| bare receiver under wrk, 16 connections: {base1:,.0f} req/s | {single / base1:.2f} |",
            f"| delivery, batch_size 100 ({n:,} messages) | {batched:,.0f} msg/s ({batched_all:,.0f} with start-up) "
            f"| bare receiver: {base100:,.0f} req/s | {batched / base100:.2f} |",
            f"| faulty receiver (30 % 500, 5 % 429 + Retry-After: 1, 5 % hang past a 0.5 s timeout), "
            f"max_attempts 4, {fault['messages']:,} messages | delivered "
            f"{fault['delivered']:,}, dead-lettered {fault['dead_lettered']:,}, lost **{fault['lost']}**, in "
            f"{fault['seconds']:.1f} s | receiver answers: {fault['answers']} | |",
        ]
    lines += ["", "![produce to webhook latency CDF](img/produce_to_webhook_cdf.png)", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    text = run(args.quick)
    (REPO / "docs" / "benchmarks-delivery.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
