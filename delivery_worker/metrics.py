"""Prometheus metrics of delivery. Names are stable and listed in docs/reference/metrics.md.

In serve's delivery process they are written to files that serve's /metrics reads
(delivery_worker/supervisor.py); the gauges then count live processes only (`livesum`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class DeliveryMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter(
            "lakebroker_delivery_attempts", "Webhook POSTs, by subscription and outcome "
            "(ok, retry, rate_limited, timeout, gone).", ["subscription", "outcome"], registry=registry,
        )
        self.delivered = Counter(
            "lakebroker_delivered_messages", "Messages acknowledged by a 2xx.", ["subscription"], registry=registry
        )
        self.dead_lettered = Counter(
            "lakebroker_dead_lettered_messages", "Messages given up on after max_attempts.", ["subscription"],
            registry=registry,
        )
        self.latency = Histogram(
            "lakebroker_delivery_latency_seconds", "Produce (log-append time) to webhook acknowledgement.",
            ["subscription"], buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self.lag = Gauge(
            "lakebroker_consumer_lag", "Committed-to-Delta offsets not yet delivered, per group and partition.",
            ["subscription", "partition"], registry=registry, multiprocess_mode="livesum",
        )
        self.in_flight = Gauge(
            "lakebroker_delivery_in_flight", "Webhook POSTs outstanding.", ["subscription"], registry=registry,
            multiprocess_mode="livesum",
        )
        self.circuit_open = Gauge(
            "lakebroker_delivery_circuit_open", "Worker processes whose circuit to the subscription's endpoint is "
            "open or half-open (delivery_worker/breaker.py).", ["subscription"], registry=registry,
            multiprocess_mode="livesum",
        )
        self.filtered = Counter(
            "lakebroker_delivery_filtered_messages",
            "Messages a subscription's filter passed over: committed past, never delivered.", ["subscription"],
            registry=registry,
        )
        self.replayed = Counter(
            "lakebroker_delivery_replayed_messages",
            "Messages sent again by a replay by predicate (POST /v1/subscriptions/{name}/replays), by outcome: "
            "delivered, or failed (retries spent).", ["subscription", "outcome"], registry=registry,
        )
        self.skipped = Counter(
            # not lakebroker_retention_skipped_messages: that family is the jobs' ({topic, group}), and one
            # /metrics page may not name a family twice
            "lakebroker_delivery_retention_skipped_messages",
            "Undelivered messages removed by retention before delivery.",
            ["subscription", "partition"], registry=registry,
        )
