"""The produce counter and latency histogram, kept as plain numbers on the event loop, expose the
same samples prometheus_client's Counter and Histogram give for the same observations."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from lakebroker.ingest_api.metrics import _LATENCY_BUCKETS, IngestMetrics


def _samples(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if "lakebroker_produce_messages" in line or "lakebroker_produce_latency" in line]


def test_loop_metrics_expose_what_prometheus_client_would() -> None:
    ours = CollectorRegistry()
    metrics = IngestMetrics(ours)
    theirs = CollectorRegistry()
    counter = Counter("lakebroker_produce_messages", "Messages accepted, by topic and ack mode.", ["topic", "ack"],
                      registry=theirs)
    histogram = Histogram("lakebroker_produce_latency_seconds", "Time from request to ack, by ack mode.", ["ack"],
                          buckets=_LATENCY_BUCKETS, registry=theirs)
    for topic, ack, n in (("orders", "wal", 3), ("orders", "none", 1), ("clicks", "wal", 0)):
        metrics.produced_to(topic, ack).inc(n)
        counter.labels(topic, ack).inc(n)
    # on a bucket's bound, between bounds, under the first and over the last
    for ack, seconds in (("wal", 0.0005), ("wal", 0.0007), ("wal", 0.003), ("wal", 9.0), ("table", 0.0001)):
        metrics.produce_latency_of(ack).observe(seconds)
        histogram.labels(ack).observe(seconds)

    theirs_samples = [s for s in _samples(theirs) if "_created" not in s]
    assert _samples(ours) == theirs_samples
    assert 'lakebroker_produce_latency_seconds_bucket{ack="wal",le="0.0005"} 1.0' in theirs_samples
