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

from bench.procs import REPO, BenchError, Server, create_topic, lakebroker_server
from bench.wrk import closed_loop

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


@dataclass
class Figures:
    rows: list[tuple[str, str, str]]
    latencies_ms: list[float]


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
            arrivals = sorted(arrived for _, _, _, arrived in stats(sink.url)["got"])
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        envelope = orjson.dumps({"topic": "bench", "partition": 0, "offset": 0, "timestamp": "x", "value": "x" * 90})
        base = closed_loop(sink.url + "/hook", work, f"receiver-{batch_size}", envelope, "application/json", 16, 5)
    steady = (len(arrivals) - 1) / max(1e-9, arrivals[-1] - arrivals[0])
    return steady, n / seconds, base.ok_rps


def latency(work: Path, seconds: float) -> list[float]:
    """Produce→webhook latency in ms at a steady 2,000 msg/s (log-append time to arrival)."""
    data = work / "latency"
    with lakebroker_server(data, env=FAST_ENV) as broker, receiver(work, "latency-sink") as sink:
        create_topic(broker.url, "bench", PARTITIONS)
        subscribe(broker.url, sink.url, ordering="partition", max_in_flight=64)
        proc = worker(data, "latency-worker")
        try:
            time.sleep(2)  # the worker takes its leases
            out = subprocess.run([sys.executable, "-m", "bench.steady_producer", "--url", broker.url, "--topic",
                                  "bench", "--rate", "2000", "--seconds", str(seconds)], cwd=REPO,
                                 capture_output=True, text=True, timeout=seconds + 60, check=True)
            sent = orjson.loads(out.stdout)["sent"]
            wait_until(lambda: len(stats(sink.url)["got"]) >= sent, 120, "latency run")
            got = stats(sink.url)["got"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return sorted((arrived - datetime.fromisoformat(ts).timestamp()) * 1000 for _, _, ts, arrived in got)


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
        delivered = {(p, o) for p, o, _, _ in stats(sink.url)["got"]}
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


def run(quick: bool) -> str:
    n = 5_000 if quick else 40_000
    with tempfile.TemporaryDirectory(prefix="lakebroker-bench-delivery-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        single, single_all, base1 = throughput(work, n, 1)
        batched, batched_all, base100 = throughput(work, n, 100)
        lat = latency(work, 5 if quick else 20)
        fault = faulty(work, 1_000 if quick else 5_000)
    img = REPO / "docs" / "img" / "produce_to_webhook_cdf.png"
    plot_cdf(lat, img)
    p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
    lines = [
        "## Delivery",
        "",
        f"Command: `python -m bench.delivery{' --quick' if quick else ''}` (also run by `make bench`). "
        f"One `lakebroker deliver` process, {PARTITIONS} partitions, receivers are uvicorn processes on 127.0.0.1. "
        "Throughput is counted from the first to the last arrival at the receiver (the worker running), "
        "and also over the whole run. The broker flushes every 100 ms (the default).",
        "",
        "| figure | value | baseline in the same run | ratio |",
        "|---|---|---|---|",
        f"| delivery, 1 message per POST, ordering none, 64 in flight ({n:,} messages) | {single:,.0f} msg/s "
        f"({single_all:,.0f} msg/s counting the worker's start-up) "
        f"| bare receiver under wrk, 16 connections: {base1:,.0f} req/s | {single / base1:.2f} |",
        f"| delivery, batch_size 100 ({n:,} messages) | {batched:,.0f} msg/s ({batched_all:,.0f} with start-up) "
        f"| bare receiver: {base100:,.0f} req/s | {batched / base100:.2f} |",
        f"| produce→webhook latency at a steady 2,000 msg/s, ordering partition ({len(lat):,} messages) "
        f"| p50 {p50:.0f} ms, p99 {p99:.0f} ms | target: p50 ≤ 300 ms, p99 ≤ 1,000 ms | |",
        f"| faulty receiver (30 % 500, 5 % 429 + Retry-After: 1, 5 % hang past a 0.5 s timeout), "
        f"max_attempts 4, {fault['messages']:,} messages | delivered "
        f"{fault['delivered']:,}, dead-lettered {fault['dead_lettered']:,}, lost **{fault['lost']}**, in "
        f"{fault['seconds']:.1f} s | receiver answers: {fault['answers']} | |",
        "",
        "![produce to webhook latency CDF](img/produce_to_webhook_cdf.png)",
        "",
    ]
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
