"""How `serve` runs delivery beside ingest (setting `delivery_mode`): a supervised child process
(the default, delivery_worker/supervisor.py) or a task on the ingest event loop (tests that read
the worker's live state). Either way the app starts it once it holds the data-dir lock, stops it
on shutdown, and asks it only for live status (`LiveStatus`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from prometheus_client import CollectorRegistry

from lakebroker.delivery_worker.metrics import DeliveryMetrics
from lakebroker.delivery_worker.pipeline import PipelineStatus
from lakebroker.delivery_worker.worker import DeliveryWorker
from lakebroker.tables.settings import Settings


class LiveStatus(Protocol):
    def status(self, name: str) -> dict[int, PipelineStatus]:
        """Per partition, the live status of a subscription's pipelines that this process runs;
        the others report theirs through the leases table."""
        ...


class EmbeddedDelivery(LiveStatus, Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class InProcessDelivery:
    def __init__(self, settings: Settings, registry: CollectorRegistry) -> None:
        self.worker = DeliveryWorker(settings, DeliveryMetrics(registry))
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self.worker.run(), name="delivery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def status(self, name: str) -> dict[int, PipelineStatus]:
        return self.worker.status(name)


def embedded_delivery(settings: Settings, registry: CollectorRegistry) -> EmbeddedDelivery | None:
    if not settings.deliver_in_serve:
        return None
    if settings.delivery_mode == "inprocess":
        return InProcessDelivery(settings, registry)
    from lakebroker.delivery_worker.supervisor import DeliveryProcess

    return DeliveryProcess(settings, registry)
