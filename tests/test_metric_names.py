"""One /metrics page never names a metric family twice: Prometheus refuses a scrape whose text holds two
`# TYPE` lines for one name, so a name shared by two owners would break every scrape of `serve`."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from lakebroker.delivery_worker.metrics import DeliveryMetrics
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.spark_pipeline.metrics import JobMetricsCollector
from lakebroker.tables.layout import Layout


def test_serves_metric_families_have_one_owner_each(tmp_path: Path) -> None:
    registry = CollectorRegistry()  # what serve's /metrics exposes: ingest, the jobs, delivery beside it
    IngestMetrics(registry)
    registry.register(JobMetricsCollector(Layout(tmp_path)))
    delivery = DeliveryMetrics(registry)
    delivery.skipped.labels("billing", "0")  # a running pipeline's counters start at zero
    text = generate_latest(registry).decode()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(names) > 10
    assert sorted({n for n in names if names.count(n) > 1}) == []
