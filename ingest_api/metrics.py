"""Prometheus metrics of the ingest tier. Names are stable and listed in the README."""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

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


class IngestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.produced = Counter(
            "lakebroker_produce_messages", "Messages accepted, by topic and ack mode.", ["topic", "ack"],
            registry=registry,
        )
        self.duplicates = Counter(
            "lakebroker_produce_duplicates", "Retried sends answered from the dedup index.", ["topic"],
            registry=registry,
        )
        self.produce_latency = Histogram(
            "lakebroker_produce_latency_seconds", "Time from request to ack, by ack mode.", ["ack"],
            buckets=_LATENCY_BUCKETS, registry=registry,
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
        self.wal_corrupt = Counter(
            "lakebroker_wal_corrupt_spans", "Corrupt WAL spans found at recovery and not replayed.",
            registry=registry,
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
        self.log_end = Gauge(
            "lakebroker_partition_log_end_offset", "Next offset to be assigned.", ["topic", "partition"],
            registry=registry,
        )
        self.committed_end = Gauge(
            "lakebroker_partition_committed_offset", "Offsets below this are committed to Delta.",
            ["topic", "partition"], registry=registry,
        )
        self.produced_to = Children(self.produced)
        self.duplicates_to = Children(self.duplicates)
        self.produce_latency_of = Children(self.produce_latency)
        self.rejected_for = Children(self.rejected)
