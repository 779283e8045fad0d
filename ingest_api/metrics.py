"""Prometheus metrics of the ingest tier. Names are stable and listed in the README."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


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
