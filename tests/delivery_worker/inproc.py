"""Delivery workers in the test's event loop, over real Delta tables (no ingest server): the
topic is appended as the flusher appends (tests/spark_pipeline/topics.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from lakebroker.delivery_worker.metrics import DeliveryMetrics
from lakebroker.delivery_worker.worker import DeliveryWorker
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.subscriptions import Ordering, Subscription, SubscriptionStore, new_secret
from tests.waiting import eventually_async


async def stop(*tasks: asyncio.Task[Any]) -> None:
    """Cancel the workers' run() tasks and wait for each to end (a cancelled run shuts down cleanly)."""
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    await eventually_async(predicate, timeout, what=what)


def worker_settings(data: Path, heartbeat_s: float = 0.2) -> Settings:
    return Settings(data_dir=data, lease_ttl_s=2, heartbeat_s=heartbeat_s, delivery_poll_ms=20,
                    offset_commit_interval_ms=100, allow_private_webhooks=True)


def worker(settings: Settings, worker_id: str) -> DeliveryWorker:
    return DeliveryWorker(settings, DeliveryMetrics(CollectorRegistry()), worker_id=worker_id)


def subscribe(data: Path, topic: str, url: str, **config: Any) -> Subscription:
    config.setdefault("ordering", Ordering.PARTITION)  # these tests read the receiver's arrival order
    sub = Subscription(name="hooks", topic=topic, url=url, retry_schedule_ms=(50,), timeout_ms=2000,
                       secrets=(new_secret(),), **config)
    return SubscriptionStore(Layout(data)).create(sub)
