"""A subscription's filter: the messages per second one delivery worker scans with a filter on a JSON
value field that passes one in ten, beside the messages per second it delivers with no filter, in the
same run."""

from __future__ import annotations

from pathlib import Path

import httpx

from bench.harness.servers import create_topic, lakebroker_server
from bench.result import Check, Mode, Result, Scenario, table
from bench.scenarios.delivery import FAST_ENV, PARTITIONS, receiver, stats, subscribe, wait_until, worker

N = {"full": 100_000, "quick": 20_000, "tiny": 2_000}
FILTER = "value.bucket = 0"  # one message in ten
TARGET_X = 5.0


def fill(url: str, n: int) -> None:
    """`n` keyless JSON values of about 100 bytes, `bucket` 0 to 9 in turn."""
    with httpx.Client(base_url=url, timeout=60) as c:
        for start in range(0, n, 5000):
            batch = [{"value": {"bucket": i % 10, "pad": "x" * 80}} for i in range(start, min(n, start + 5000))]
            c.post("/v1/topics/bench/batch?ack=table", json={"messages": batch}).raise_for_status()


def one_run(work: Path, n: int, flt: str | None) -> tuple[float, int]:
    """Offsets per second the worker went through (delivered, or passed over by the filter) from its first
    delivery to its last, and the messages delivered."""
    name = "filtered" if flt else "unfiltered"
    data = work / name
    with lakebroker_server(data, env=FAST_ENV) as broker, receiver(work, f"sink-{name}") as sink:
        create_topic(broker.url, "bench", PARTITIONS)
        fill(broker.url, n)
        expected = n // 10 if flt else n
        subscribe(broker.url, sink.url, ordering="none", max_in_flight=64, batch_size=1,
                  **({"filter": flt} if flt else {}))
        proc = worker(data, f"{name}-worker")
        try:
            wait_until(lambda: len(stats(sink.url)["got"]) >= expected, 600, f"{name} run")
            got = stats(sink.url)["got"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    arrivals = sorted(arrived for _, _, _, arrived, _ in got)
    # Offsets gone through between the first and the last delivery: per partition, from the first
    # delivered offset to the last (those passed over in between included).
    spans: dict[int, tuple[int, int]] = {}
    for partition, offset, _, _, _ in got:
        low, high = spans.get(partition, (offset, offset))
        spans[partition] = (min(low, offset), max(high, offset))
    covered = sum(high - low + 1 for low, high in spans.values()) - len(spans)
    return covered / max(1e-9, arrivals[-1] - arrivals[0]), len(got)


def measure(mode: Mode, work: Path) -> Result:
    n = N[mode]
    plain, delivered_plain = one_run(work, n, None)
    scanned, delivered = one_run(work, n, FILTER)
    ratio = scanned / plain
    return Result(
        scenario="filtered_delivery",
        checks=[Check("offsets scanned per second with a filter passing 1 in 10, over delivered per second "
                      "with none", ratio, "x", TARGET_X,
                      baseline=f"unfiltered {plain:,.0f} msg/s delivered; filtered {scanned:,.0f} offsets/s scanned")],
        headlines=[f"a filter passing 1 in 10: {scanned:,.0f} offsets/s scanned, {ratio:.1f}x the {plain:,.0f} msg/s "
                   "delivered with no filter"],
        tables=[table("One `lakebroker deliver` process, ordering none, 64 in flight, one message per POST.",
                      ["subscription", "messages in the topic", "delivered", "offsets/s, first to last delivery"],
                      [["no filter", f"{n:,}", f"{delivered_plain:,}", f"{plain:,.0f}"],
                       [f"`{FILTER}`", f"{n:,}", f"{delivered:,}", f"{scanned:,.0f}"]])],
        figures={"messages": n, "unfiltered_msg_s": plain, "filtered_offsets_s": scanned, "ratio": ratio,
                 "delivered": delivered},
    )


SCENARIO = Scenario(
    name="filtered_delivery", title="Filtered delivery", measure=measure,
    setup="`lakebroker serve` with its delivery off and one `lakebroker deliver` process; "
          f"{PARTITIONS} partitions; a uvicorn receiver process on 127.0.0.1.",
    load=f"{N['full']:,} JSON values of about 100 bytes already in the table (`bucket` 0 to 9 in turn), delivered "
         "once by a subscription with no filter and once, on a second server, by one with the filter "
         f"`{FILTER}`; ordering `none`, 64 in flight, one message per POST.",
    metric="Offsets per second the worker goes through from its first delivery to its last (each partition's "
           "span, whether delivered or passed over by the filter).",
    target=f"with the filter, ≥ {TARGET_X:.0f}x the offsets per second of the unfiltered subscription.",
    timeout_s=900,
)
