"""Prometheus metrics of the ingest tier. Names are stable and listed in docs/reference/metrics.md."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

M = TypeVar("M", bound=MetricWrapperBase)

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Children(Generic[M]):
    """A labelled metric's children, bound once: `labels()` takes a lock and builds a tuple per call,
    a cost the produce hot path pays on every request otherwise."""

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._bound: dict[tuple[str, ...], M] = {}

    def __call__(self, *labels: str) -> M:
        child = self._bound.get(labels)
        if child is None:
            child = self._bound[labels] = self._metric.labels(*labels)
        return child


class LoopCount:
    """A counter child bumped on the event loop only: a plain number. prometheus_client's takes a lock
    and checks its state per `inc`, which the single-message path paid for on every message."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class LoopTiming:
    """A histogram child observed on the event loop only: bucket counts in a list, found by bisection."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: over every bound (+Inf)
        self.total = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # Prometheus buckets hold values <= their bound
        self.total += amount


class _LoopMetrics(Collector):
    """The produce counter and latency histogram, kept as LoopCount / LoopTiming children and read at
    scrape time; the samples are prometheus_client's for the same metrics."""

    def __init__(self) -> None:
        self.produced: dict[tuple[str, str], LoopCount] = {}
        self.latency: dict[str, LoopTiming] = {}

    def produced_to(self, topic: str, ack: str) -> LoopCount:
        child = self.produced.get((topic, ack))
        if child is None:
            child = self.produced[(str(topic), str(ack))] = LoopCount()
        return child

    def produce_latency_of(self, ack: str) -> LoopTiming:
        child = self.latency.get(ack)
        if child is None:
            child = self.latency[str(ack)] = LoopTiming(_LATENCY_BUCKETS)
        return child

    def collect(self) -> Iterator[Metric]:
        produced = CounterMetricFamily("lakebroker_produce_messages", "Messages accepted, by topic and ack mode.",
                                       labels=["topic", "ack"])
        for labels, child in list(self.produced.items()):
            produced.add_metric(labels, child.value)
        yield produced
        latency = HistogramMetricFamily("lakebroker_produce_latency_seconds", "Time from request to ack, by ack mode.",
                                        labels=["ack"])
        for ack, timing in list(self.latency.items()):
            cumulative, buckets = 0, []
            for bound, count in zip([*map(str, timing.bounds), "+Inf"], list(timing.counts), strict=True):
                cumulative += count
                buckets.append((bound, float(cumulative)))
            latency.add_metric([ack], buckets, timing.total)
        yield latency


class IngestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        loop_metrics = _LoopMetrics()
        registry.register(loop_metrics)
        self.produced_to = loop_metrics.produced_to  # lakebroker_produce_messages{topic, ack}
        self.produce_latency_of = loop_metrics.produce_latency_of  # lakebroker_produce_latency_seconds{ack}
        self.duplicates = Counter(
            "lakebroker_produce_duplicates", "Retried sends answered from the dedup index.", ["topic"],
            registry=registry,
        )
        self.rejected = Counter(
            "lakebroker_produce_rejected", "Produce requests refused, by reason.", ["reason"], registry=registry
        )
        self.wal_backlog_bytes = Gauge(
            "lakebroker_wal_backlog_bytes", "Accepted bytes not yet committed to Delta.", registry=registry
        )
        self.wal_group_size = Histogram(
            "lakebroker_wal_group_commit_records", "Records made durable by one fsync.",
            buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536), registry=registry,
        )
        self.wal_segments = Gauge("lakebroker_wal_segments", "WAL segment files on disk.", registry=registry)
        self.clock_skew = Gauge(
            "lakebroker_clock_skew_seconds", "How far this node's clock is ahead of the table storage's (negative: "
            "behind). Past a quarter of the lease TTL the node takes no partitions.", registry=registry)
        self.clock_refused = Gauge(
            "lakebroker_clock_refused", "1 while this node takes no partitions because its clock is too far off.",
            registry=registry)
        self.parked_messages = Gauge(
            "lakebroker_parked_messages",
            "Acknowledged messages this node holds of partitions it does not own, until their owner has "
            "them or this node claims the partition.", registry=registry,
        )
        self.wal_corrupt = Counter(
            "lakebroker_wal_corrupt_spans", "Corrupt WAL spans found at recovery and not replayed.",
            registry=registry,
        )
        self.wal_lost_offsets = Gauge(
            "lakebroker_wal_lost_offsets",
            "Offsets lost to WAL damage whose partition is held until `lakebroker wal skip`.",
            ["topic", "partition"], registry=registry,
        )
        self.flush_latency = Histogram(
            "lakebroker_flush_latency_seconds", "Duration of one Delta commit of the flusher.",
            buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.flush_batch = Histogram(
            "lakebroker_flush_batch_records", "Rows in one Delta commit of the flusher.",
            buckets=(1, 10, 100, 1000, 10_000, 100_000, 1_000_000), registry=registry,
        )
        self.flush_errors = Counter(
            "lakebroker_flush_errors", "Failed Delta commits (retried).", ["topic"], registry=registry
        )
        self.assigned_end = Gauge(
            "lakebroker_partition_log_end_offset", "The assigned end: the next offset to be assigned.",
            ["topic", "partition"],
            registry=registry,
        )
        self.topic_unavailable = Gauge(
            "lakebroker_topic_unavailable",
            "1 while this node cannot read the topic's table (it takes no messages for it), else 0.",
            ["topic"], registry=registry,
        )
        self.group_lag = Gauge(
            "lakebroker_group_lag",
            "Committed-to-Delta offsets a consumer group (a pull consumer's or a Spark stream's) has not committed "
            "past, per partition this node owns.", ["group", "topic", "partition"], registry=registry,
        )
        self.kafka_requests = Counter(
            "lakebroker_kafka_requests", "Requests the Kafka listener answered, by API.", ["api"], registry=registry,
        )
        self.kafka_partition_errors = Counter(
            "lakebroker_kafka_partition_errors", "Partitions of Produce and Fetch requests answered with an error, "
            "by API and Kafka error name.", ["api", "error"], registry=registry,
        )
        self.kafka_connections = Gauge(
            "lakebroker_kafka_connections", "Open connections of the Kafka listener.", registry=registry
        )
        self.kafka_closed = Counter(
            "lakebroker_kafka_connections_closed", "Kafka connections the listener closed, by reason: malformed "
            "(a request it cannot read, or one that did not arrive in time), auth (SASL failed, or a token that no "
            "longer holds), limit (too many open).", ["reason"], registry=registry,
        )
        self.high_watermark = Gauge(
            "lakebroker_partition_high_watermark", "The committed end: offsets below it are in the Delta table.",
            ["topic", "partition"], registry=registry,
        )
        self._committed_offset = Gauge(  # the same, under its former name, for one more release
            "lakebroker_partition_committed_offset",
            "Deprecated: lakebroker_partition_high_watermark under its former name; removed in the next release.",
            ["topic", "partition"], registry=registry,
        )
        self.backpressure_waits = Counter(
            "lakebroker_backpressure_waits_total",
            "Produce requests that found the backlog over max_backlog_bytes and waited for a commit to make room.",
            registry=registry,
        )
        self.duplicates_to = Children(self.duplicates)
        self.rejected_for = Children(self.rejected)

    def set_high_watermark(self, topic: str, partition: int, end: int) -> None:
        for gauge in (self.high_watermark, self._committed_offset):
            gauge.labels(topic, str(partition)).set(end)
