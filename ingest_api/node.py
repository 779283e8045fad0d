"""One ingest node's parts, built once: the broker, the produce core its doors produce through
(with the router it forwards by), and the authenticator. The composition root
(lakebroker/server.py) builds a node and hands it to each door
(the app, the fast single-message path); a door takes what it needs from here, never from another
door's state."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.auth import Authenticator, auth_enforced
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.node_identity import node_credential
from lakebroker.ingest_api.produce_core import ProduceCore
from lakebroker.ingest_api.router import Router
from lakebroker.tables.layout import Layout
from lakebroker.tables.lock import DataDirLock
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import TokenStore


@dataclass(frozen=True, slots=True)
class IngestNode:
    settings: Settings
    metrics: IngestMetrics
    broker: Broker
    router: Router
    core: ProduceCore
    auth: Authenticator
    lock: DataDirLock

    @classmethod
    def build(cls, settings: Settings, registry: CollectorRegistry | None = None) -> IngestNode:
        """The parts, not yet started: nothing here reads the data dir."""
        metrics = IngestMetrics(registry or CollectorRegistry())
        broker = Broker(settings, metrics)
        layout = Layout.of(settings)
        auth = Authenticator(TokenStore(layout), auth_enforced(settings), max_age_s=settings.auth_cache_ms / 1000)
        router = Router(broker)
        return cls(settings, metrics, broker, router, ProduceCore(broker, router), auth,
                   DataDirLock(layout.lock_file))

    async def start(self) -> None:
        """Take the data dir (one process assigns its offsets), recover, join the cluster, then
        open the router with this node's own credential."""
        self.lock.acquire(self.settings.data_dir)
        await self.auth.start()
        await self.broker.start()
        credential = await asyncio.to_thread(node_credential, self.settings, Layout.of(self.settings),
                                             self.broker.cluster.node)
        self.router.start(credential)

    async def stop(self) -> None:
        """In reverse; safe after a start that failed part way."""
        try:
            if self.broker.started:
                await self.router.stop()
                await self.broker.stop()
        finally:
            self.lock.release()
