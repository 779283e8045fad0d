"""The ingest app: builds the broker for a data dir and includes each route module."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.asgi_route import FrontDoor
from lakebroker.ingest_api.auth import (
    AUTH_ERRORS,
    AUTHENTICATED,
    AuthGate,
    check_every_route_decided,
    public,
    public_routes,
    require,
)
from lakebroker.ingest_api.dashboard import Dashboard
from lakebroker.ingest_api.errors import ProxyErrorShape, install_error_handlers
from lakebroker.ingest_api.limits import BodyLimit, HeaderLimit
from lakebroker.ingest_api.live_status import LiveStatus, Service
from lakebroker.ingest_api.node import IngestNode
from lakebroker.ingest_api.routes import (
    cluster,
    consume,
    consumer_groups,
    dashboard,
    ops,
    produce,
    replays,
    rest_proxy,
    rest_proxy_v3,
    subscriptions,
    topics,
    wal,
)
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import Scope

YOUNG_GC_THRESHOLD = 10_000


def create_app(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    on_started: Callable[[], None] | None = None,
    *,
    services: Sequence[Service] = (),
    live_status: LiveStatus | None = None,
    node: IngestNode | None = None,
) -> FastAPI:
    """Build the app over `node` (by default one built here for `settings`). `services` start, in
    order, once the node holds the data-dir lock and recovery is done, and stop in reverse at
    shutdown; then `on_started` runs. `live_status` is what the subscription status and the
    dashboard show of the delivery pipelines running beside the app."""
    node = node or IngestNode.build(settings, registry)
    broker, auth = node.broker, node.auth

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        thresholds = gc.get_threshold()
        sampling: asyncio.Task[None] | None = None
        try:
            await node.start()
            for service in services:
                await service.start()
            if on_started is not None:
                on_started()
            sampling = asyncio.create_task(board.sample())  # the charts' history (dashboard_history.py)
            # What start-up made (modules, the app, recovered state) lives as long as the process:
            # outside the collector's generations, a full collection walks only what came after.
            gc.collect()
            gc.freeze()
            # A request allocates a dozen or so tracked objects, almost none in cycles: the default 700
            # collects every few dozen requests for nothing, and 10,000 still bounds the young generation
            # tightly in memory (docs/decisions/0004-garbage-collector-tuned-for-the-request-path.md).
            gc.set_threshold(YOUNG_GC_THRESHOLD, *thresholds[1:])
            yield
        finally:
            if sampling is not None:
                sampling.cancel()
            gc.unfreeze()  # collectable again once this app is done (several apps share a test process)
            if gc.get_threshold()[0] == YOUNG_GC_THRESHOLD:
                gc.set_threshold(*thresholds)
            for service in reversed(services):
                await service.stop()  # safe if it never started
            await node.stop()

    app = FastAPI(
        title="lakebroker",
        version="0.1.0",
        summary="A message broker whose log is a Delta Lake table.",
        lifespan=lifespan,
        openapi_url="/openapi.json" if settings.docs_public else None,  # the docs need no token; see docs/security.md
        docs_url="/docs" if settings.docs_public else None,
        redoc_url="/redoc" if settings.docs_public else None,
    )
    # The routes' parts, read through ingest_api/deps.py. The fast path is handed the node itself.
    app.state.broker = broker
    app.state.core = node.core
    app.state.settings = settings
    app.state.auth = auth
    app.state.live_status = live_status
    app.state.dashboard = board = Dashboard(broker, live_status)
    install_error_handlers(app)
    # Who may call what. Every router states it here; the app refuses to build with one that does not.
    app.include_router(ops.router, dependencies=[public()])  # /healthz, /readyz
    app.include_router(ops.metrics_router, responses=AUTH_ERRORS,
                       dependencies=[public() if settings.metrics_public else require(Scope.METRICS)])
    app.include_router(topics.router, responses=AUTH_ERRORS, dependencies=[
        require(Scope.ADMIN, read=AUTHENTICATED, topic_checked_by_route=True)])
    app.include_router(produce.router, responses=AUTH_ERRORS, dependencies=[require(Scope.PRODUCE)])
    app.include_router(rest_proxy.produce_router, responses=rest_proxy.AUTH_ERRORS,
                       dependencies=[require(Scope.PRODUCE)])
    app.include_router(rest_proxy.metadata_router, responses=rest_proxy.AUTH_ERRORS,
                       dependencies=[require(AUTHENTICATED, topic_checked_by_route=True)])
    app.include_router(rest_proxy_v3.produce_router, responses=rest_proxy_v3.AUTH_ERRORS,
                       dependencies=[require(Scope.PRODUCE)])
    app.include_router(rest_proxy_v3.cluster_router, responses=rest_proxy_v3.AUTH_ERRORS,
                       dependencies=[require(AUTHENTICATED)])
    app.include_router(cluster.router, responses=AUTH_ERRORS,
                       dependencies=[require(AUTHENTICATED, topic_checked_by_route=True)])
    app.include_router(consume.router, responses=AUTH_ERRORS, dependencies=[require(Scope.CONSUME)])
    app.include_router(consumer_groups.router, responses=AUTH_ERRORS, dependencies=[require(Scope.CONSUME)])
    app.include_router(subscriptions.router, responses=AUTH_ERRORS, dependencies=[require(
        Scope.ADMIN, read=Scope.CONSUME, paths={"/v1/subscriptions/{name}/dead-letters": Scope.ADMIN})])
    app.include_router(replays.router, responses=AUTH_ERRORS, dependencies=[require(Scope.ADMIN, read=Scope.CONSUME)])
    app.include_router(wal.router, responses=AUTH_ERRORS, dependencies=[require(Scope.ADMIN)])
    # The page is a static shell (no data); its JSON lists everything and drives replay: admin.
    app.include_router(dashboard.page_router, dependencies=[public()])
    app.include_router(dashboard.router, responses=AUTH_ERRORS, dependencies=[
        require(Scope.ADMIN, topic_checked_by_route=True)])
    check_every_route_decided(app)
    guards: list[tuple[Any, dict[str, Any]]] = [  # innermost first
        (BodyLimit, {"max_bytes": settings.max_request_bytes, "read_timeout_s": settings.body_read_timeout_s}),
        (AuthGate, {"authenticator": auth, "public_routes": public_routes(app)}),  # before any body is read
        (HeaderLimit, {}),
    ]
    for guard, kwargs in guards:
        app.add_middleware(guard, **kwargs)
    app.add_middleware(ProxyErrorShape)  # every error under /topics and /v3 in the REST Proxy's shapes
    app.add_middleware(FrontDoor, api=app, guards=guards)  # outermost: produce skips the router
    return app
