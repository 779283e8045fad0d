"""Prometheus metrics of the maintenance jobs, read from `_system/job_runs` and
`_system/retention_skips` at scrape time (delta-rs, cached a few seconds; no pyspark).

    lakebroker_job_last_run_timestamp_seconds{job,outcome}
    lakebroker_job_last_duration_seconds{job}
    lakebroker_job_last_success_timestamp_seconds{job}
    lakebroker_job_runs{job,outcome}                      runs still in the job_runs history
    lakebroker_job_rows_removed{job,topic}                rows removed by runs in the history
    lakebroker_retention_skipped_messages_total{topic,group}
    lakebroker_retention_skips_total{topic,group}

Register with `registry.register(JobMetricsCollector(layout))`.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from lakebroker.tables import job_runs
from lakebroker.tables.layout import Layout
from lakebroker.tables.retention_skips import retention_skips


class JobMetricsCollector(Collector):
    def __init__(self, layout: Layout, cache_s: float = 10.0) -> None:
        self.layout = layout
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Any]] = (0.0, [])

    def collect(self) -> Iterator[Any]:
        with self._lock:
            at, families = self._cached
            if time.monotonic() - at > self.cache_s:
                families = self._read()
                self._cached = (time.monotonic(), families)
        yield from families

    def _read(self) -> list[Any]:
        last_run = GaugeMetricFamily("lakebroker_job_last_run_timestamp_seconds",
                                     "Start of each job's newest run", labels=["job", "outcome"])
        last_duration = GaugeMetricFamily("lakebroker_job_last_duration_seconds",
                                          "Duration of each job's newest run", labels=["job"])
        last_success = GaugeMetricFamily("lakebroker_job_last_success_timestamp_seconds",
                                         "Start of each job's newest successful run", labels=["job"])
        runs = GaugeMetricFamily("lakebroker_job_runs", "Runs in the job_runs history", labels=["job", "outcome"])
        removed = GaugeMetricFamily("lakebroker_job_rows_removed", "Rows removed by runs in the history",
                                    labels=["job", "topic"])
        skipped = CounterMetricFamily("lakebroker_retention_skipped_messages",
                                      "Messages a consumer group never got because retention removed them",
                                      labels=["topic", "group"])
        skips = CounterMetricFamily("lakebroker_retention_skips", "Times retention moved a group forward",
                                    labels=["topic", "group"])
        rows = job_runs.last_runs(self.layout, limit=1_000_000)
        newest: dict[str, dict[str, Any]] = {}
        success: dict[str, float] = {}
        by_run: dict[tuple[str, str], str] = {}
        durations: dict[str, float] = {}
        removed_by: dict[tuple[str, str], int] = defaultdict(int)
        for r in rows:  # newest first
            job, started = r["job"], r["started_at"].timestamp()
            worst = by_run.get((job, r["run_id"]))
            by_run[(job, r["run_id"])] = "failed" if "failed" in (worst, r["outcome"]) else r["outcome"]
            if job not in newest:
                newest[job] = r
            if r["run_id"] == newest[job]["run_id"]:
                durations[job] = max(durations.get(job, 0.0), r["duration_ms"] / 1000)
            if r["outcome"] == "ok" and job not in success:
                success[job] = started
            if r["rows_removed"]:
                removed_by[(job, r["topic"] or r["target"])] += int(r["rows_removed"])
        for job, r in newest.items():
            last_run.add_metric([job, by_run[(job, r["run_id"])]], r["started_at"].timestamp())
            last_duration.add_metric([job], durations[job])
        for job, at in success.items():
            last_success.add_metric([job], at)
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for (job, _), outcome in by_run.items():
            counts[(job, outcome)] += 1
        for (job, outcome), n in sorted(counts.items()):
            runs.add_metric([job, outcome], n)
        for (job, topic), n in sorted(removed_by.items()):
            removed.add_metric([job, topic], n)
        totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for s in retention_skips(self.layout):
            totals[(s.topic, s.group)][0] += s.skipped_messages
            totals[(s.topic, s.group)][1] += 1
        for (topic, group), (messages, count) in sorted(totals.items()):
            skipped.add_metric([topic, group], messages)
            skips.add_metric([topic, group], count)
        return [last_run, last_duration, last_success, runs, removed, skipped, skips]
