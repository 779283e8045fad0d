"""The ingest app: builds the broker for a data dir and includes each route module."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from delivery_worker.metrics import DeliveryMetrics
from delivery_worker.worker import DeliveryWorker
from ingest_api.broker import Broker
from ingest_api.errors import install_error_handlers
from ingest_api.limits import BodyLimit
from ingest_api.metrics import IngestMetrics
from ingest_api.routes import consume, ops, produce, rest_proxy, subscriptions, topics
from tables.errors import LakebrokerError
from tables.layout import Layout
from tables.lock import DataDirLock
from tables.settings import Settings


class DataDirBusy(LakebrokerError):
    code = "data_dir_busy"


def create_app(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    on_started: Callable[[], None] | None = None,
) -> FastAPI:
    """Build the app. `on_started` runs once the data-dir lock is held and recovery is done."""
    registry = registry or CollectorRegistry()
    metrics = IngestMetrics(registry)
    broker = Broker(settings, metrics)
    delivery = DeliveryWorker(settings, DeliveryMetrics(registry)) if settings.deliver_in_serve else None
    lock = DataDirLock(Layout(settings.data_dir).lock_file)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        delivering: asyncio.Task[None] | None = None
        if not lock.try_acquire():
            raise DataDirBusy(f"another lakebroker process owns {settings.data_dir}; stop it or use --data-dir")
        try:
            await broker.start()
            if delivery is not None:
                delivering = asyncio.create_task(delivery.run())
            if on_started is not None:
                on_started()
            yield
        finally:
            if delivering is not None:
                delivering.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await delivering
            if broker.started:
                await broker.stop()
            lock.release()

    app = FastAPI(
        title="lakebroker",
        version="0.1.0",
        summary="A message broker whose log is a Delta Lake table.",
        lifespan=lifespan,
    )
    app.state.broker = broker
    app.state.settings = settings
    app.state.delivery = delivery
    install_error_handlers(app)
    for module in (topics, produce, consume, rest_proxy, subscriptions, ops):
        app.include_router(module.router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    return app
