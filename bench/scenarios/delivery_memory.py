"""Delivery's memory: one `lakebroker deliver` process catching up ten subscriptions on a topic of
1 MB messages, its peak resident set (the kernel's high-water mark, VmHWM) from its start until all
ten have delivered everything, beside the same process's resident set before any subscription."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from bench.harness.memory import peak_rss_mb, rss_mb
from bench.harness.servers import BenchError, create_topic, lakebroker_server
from bench.result import Check, Mode, Result, Scenario
from bench.scenarios.delivery import FAST_ENV, PARTITIONS, receiver, stats, subscribe, wait_until, worker

N = {"full": 400, "quick": 120, "tiny": 16}  # messages of VALUE_BYTES each
VALUE_BYTES, SUBSCRIPTIONS, TARGET_MB = 1_000_000, 10, 512.0  # values just under the default 1 MiB limit


def fill(url: str, n: int) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        for start in range(0, n, 8):  # 8 MB a request
            batch = {"messages": [{"value": "x" * VALUE_BYTES}] * min(8, n - start)}
            c.post("/v1/topics/bench/batch?ack=table", json=batch).raise_for_status()


def measure(mode: Mode, work: Path) -> Result:
    n, data = N[mode], work / "data"
    with lakebroker_server(data, env=FAST_ENV) as broker, receiver(work, "sink") as sink:
        create_topic(broker.url, "bench", PARTITIONS)
        fill(broker.url, n)
        proc = worker(data, "memory-worker")
        try:
            time.sleep(5)  # started, membership taken, nothing to deliver yet
            idle, began = rss_mb(proc.pid), time.monotonic()
            for i in range(SUBSCRIPTIONS):  # each from the start: n messages behind
                subscribe(broker.url, sink.url, name=f"lagging-{i}")
            wait_until(lambda: len(stats(sink.url)["got"]) >= n * SUBSCRIPTIONS, 1500, "ten lagging subscriptions")
            seconds, peak = time.monotonic() - began, peak_rss_mb(proc.pid)
            if idle is None or peak is None:
                raise BenchError("the delivery worker exited before it caught up")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    rate = n * SUBSCRIPTIONS * VALUE_BYTES / 1e6 / seconds
    return Result(
        scenario="delivery_memory",
        checks=[Check("delivery process peak RSS, ten subscriptions catching up on 1 MB messages", peak, "MB",
                      TARGET_MB, higher_is_better=False, baseline=f"the same process idle: {idle:,.0f} MB")],
        headlines=[f"one delivery process caught up ten subscriptions on {n:,} messages of 1 MB in {seconds:,.0f} s "
                   f"({rate:,.0f} MB/s delivered), peaking at {peak:,.0f} MB of RSS ({idle:,.0f} MB idle)"],
        figures={"messages": n, "seconds": seconds, "idle_rss_mb": idle, "peak_rss_mb": peak, "delivered_mb_s": rate},
    )


SCENARIO = Scenario(
    name="delivery_memory", title="Delivery memory", measure=measure,
    setup="`lakebroker serve` with its delivery off and one `lakebroker deliver` process at its defaults "
          f"(read-ahead: 16 MiB a partition, 64 MiB a process); {PARTITIONS} partitions; a uvicorn receiver "
          "process on 127.0.0.1.",
    load=f"{N['full']:,} text values of {VALUE_BYTES:,} bytes already in the table; then {SUBSCRIPTIONS} "
         "subscriptions created at once, each from the earliest offset, so all ten catch up together (ordering `key`: "
         "keyless messages one in flight per partition; one message per POST).",
    metric="The delivery process's peak resident set (VmHWM, the kernel's high-water mark) over its whole life, "
           "beside its resident set once started and before any subscription.",
    target=f"the delivery process's peak RSS ≤ {TARGET_MB:.0f} MB.",
    timeout_s=1800,
)
