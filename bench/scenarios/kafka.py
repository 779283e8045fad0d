"""Kafka's own ProducerPerformance and ConsumerPerformance against lakebroker's Kafka listener and
against a real single-node Kafka broker on the same host, in the same run, alternating."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.harness.kafka import (
    Consumed,
    Produced,
    consumer_perf,
    create_kafka_topic,
    kafka_broker,
    producer_perf,
)
from bench.harness.servers import NO_JOBS, BenchError, create_topic, lakebroker_server, metrics
from bench.result import Check, Mode, Result, Scenario, table

TARGET_RATIO = 0.5
ACKS = ("1", "all")


@dataclass(frozen=True)
class Sizes:
    records: int
    rounds: int
    warmup: int


SIZES = {"full": Sizes(1_000_000, 2, 200_000), "quick": Sizes(200_000, 1, 50_000), "tiny": Sizes(5_000, 1, 1_000)}


def _drained(url: str, timeout_s: float = 120) -> None:
    """Wait until the WAL's backlog is in the table: a Kafka consumer of lakebroker reads the table."""
    deadline = time.monotonic() + timeout_s
    while metrics(url).get("lakebroker_wal_backlog_bytes", 0) > 0:
        if time.monotonic() > deadline:
            raise BenchError("lakebroker's WAL backlog did not reach the table in time")
        time.sleep(0.2)


def run(mode: Mode, work: Path) -> Result:
    sz = SIZES[mode]
    produced: dict[tuple[str, str], list[Produced]] = {}
    consumed: dict[str, Consumed] = {}
    with kafka_broker(work) as kafka, lakebroker_server(work / "kafka-data", env=NO_JOBS) as lb:
        ours = orjson.loads((work / "kafka-data" / "server.json").read_bytes())["kafka"]
        brokers = {"kafka": kafka, "lakebroker": ours}

        def topic(broker: str, name: str) -> str:
            if broker == "kafka":
                create_kafka_topic(kafka, name)
            else:
                create_topic(lb.url, name)
            return name

        for broker, address in brokers.items():  # the JVMs' and the listener's first requests
            producer_perf(address, topic(broker, "warm-up"), sz.warmup, "1")
        for r in range(sz.rounds):
            order = list(brokers.items()) if r % 2 == 0 else list(brokers.items())[::-1]
            for acks in ACKS:
                for broker, address in order:
                    figures = producer_perf(address, topic(broker, f"perf-{acks}-{r}"), sz.records, acks)
                    produced.setdefault((broker, acks), []).append(figures)
        _drained(lb.url)
        for broker, address in brokers.items():
            consumed[broker] = consumer_perf(address, "perf-1-0", sz.records)
        peak = lb.peak_rss_mb()

    def best(broker: str, acks: str) -> Produced:
        return max(produced[(broker, acks)], key=lambda f: f.records_s)

    checks = []
    for acks in ACKS:
        ref, mine = best("kafka", acks), best("lakebroker", acks)
        checks.append(Check(f"produce acks={acks}, over Kafka", mine.records_s / ref.records_s, "x", TARGET_RATIO,
                            baseline=f"Kafka {ref.records_s:,.0f} records/s, lakebroker {mine.records_s:,.0f}"))
    ref_c, mine_c = consumed["kafka"], consumed["lakebroker"]
    checks.append(Check("consume, over Kafka", mine_c.records_s / ref_c.records_s, "x", TARGET_RATIO,
                        baseline=f"Kafka {ref_c.records_s:,.0f} records/s, lakebroker {mine_c.records_s:,.0f}"))
    rows = [[f"produce acks={acks}", broker, f"{best(broker, acks).records_s:,.0f}", f"{best(broker, acks).mb_s:.1f}",
             f"{best(broker, acks).p50_ms:,.0f}", f"{best(broker, acks).p99_ms:,.0f}", ""]
            for acks in ACKS for broker in brokers]
    rows += [["consume", broker, f"{c.records_s:,.0f}", f"{c.mb_s:.1f}", "", "", f"{c.rebalance_ms:,.0f}"]
             for broker, c in consumed.items()]
    return Result(
        scenario="kafka", checks=checks,
        headlines=[f"{c.name}: {c.shown(c.value)} ({c.baseline})" for c in checks],
        tables=[table("", ["load", "broker", "records/s", "MB/s", "p50 ms", "p99 ms", "group join ms"], rows)],
        notes=["Each figure is the best of the rounds. Kafka's producer sends up to 5 requests at a time per "
               "broker; its latency figures include the time a record waits in the producer's buffer, which "
               "fills at full speed."],
        figures={"produced": {f"{b}-acks{a}": [vars(f) for f in fs] for (b, a), fs in produced.items()},
                 "consumed": {b: vars(c) for b, c in consumed.items()}, "peak_rss_mb": peak},
    )


SCENARIO = Scenario(
    name="kafka", title="Kafka clients: lakebroker's listener beside a Kafka broker", measure=run,
    setup="`lakebroker serve` at its defaults on 127.0.0.1 (its WAL fsynced per group commit; `acks=all` waits for "
          "`kafka_acks_all=wal`), scheduled jobs off; beside it Apache Kafka 4.4.0 from Maven Central's jars, one "
          "KRaft node (broker and controller) at its defaults (it does not fsync), heap 1 GiB. Each load writes a "
          "topic of its own with 3 partitions, created for it on both.",
    load="Kafka's `ProducerPerformance` (`--record-size 100 --throughput -1`, the Java producer's defaults: "
         "`batch.size` 16 KiB, `linger.ms` 5, idempotence with `acks=all`), 1,000,000 records per run with "
         "`acks=1` and with `acks=all`, two rounds, the two brokers alternating; then `ConsumerPerformance` reads "
         "the first round's `acks=1` topic from the start with a new group, from each broker.",
    metric="Records per second of each tool's run, lakebroker's over Kafka's of the same run.",
    target=f"produce (`acks=1` and `acks=all`) and consume at ≥ {TARGET_RATIO}x the Kafka broker's records/s.",
)
