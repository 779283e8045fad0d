"""The ingest app: builds the broker for a data dir and includes each route module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from ingest_api.broker import Broker
from ingest_api.errors import install_error_handlers
from ingest_api.limits import BodyLimit
from ingest_api.metrics import IngestMetrics
from ingest_api.routes import consume, ops, produce, rest_proxy, topics
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
    metrics = IngestMetrics(registry or CollectorRegistry())
    broker = Broker(settings, metrics)
    lock = DataDirLock(Layout(settings.data_dir).lock_file)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not lock.try_acquire():
            raise DataDirBusy(f"another lakebroker process owns {settings.data_dir}; stop it or use --data-dir")
        try:
            await broker.start()
            if on_started is not None:
                on_started()
            yield
        finally:
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
    install_error_handlers(app)
    for module in (topics, produce, consume, rest_proxy, ops):
        app.include_router(module.router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    return app
