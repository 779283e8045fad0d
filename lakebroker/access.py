"""How a CLI command reaches a data dir's broker.

Only one process may assign a data dir's offsets (tables/lock.py). If a server holds the lock,
the command calls its HTTP API at the address `serve` wrote to `server.json`; if other nodes of
a cluster serve the tables (docs/cluster.md), it calls one of them; otherwise it runs an embedded
broker for its own duration.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import orjson
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.tables.errors import (
    AlreadyExists,
    Backpressure,
    Forbidden,
    InvalidRequest,
    LakebrokerError,
    NotFound,
    StorageUnavailable,
    TooLarge,
    Unauthenticated,
)
from lakebroker.tables.layout import Layout
from lakebroker.tables.lock import DataDirLock
from lakebroker.tables.ownership import read_view
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, new_topic

if TYPE_CHECKING:
    from lakebroker.ingest_api.broker import Broker


class BrokerAccess(Protocol):
    def create_topic(self, name: str, partitions: int, config: dict[str, Any]) -> dict[str, Any]: ...
    def produce(self, topic: str, message: NewMessage, ack: AckMode) -> dict[str, Any]: ...
    def delete_topic(self, name: str) -> None: ...
    def skip_lost(self, topic: str, partition: int) -> dict[str, Any]: ...


class EmbeddedAccess:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def _run(self, work: Any) -> Any:
        # Imported here: the broker (numpy, the flusher, delta-rs) is most of a CLI's start-up,
        # and commands that never open one (sql, the Spark jobs, --help) should not pay for it.
        from lakebroker.ingest_api.broker import Broker
        from lakebroker.ingest_api.metrics import IngestMetrics

        async def main() -> Any:
            broker = Broker(self.settings, IngestMetrics(CollectorRegistry()))
            await broker.start()
            try:
                return await work(broker)
            finally:
                await broker.stop()

        return asyncio.run(main())

    def create_topic(self, name: str, partitions: int, config: dict[str, Any]) -> dict[str, Any]:
        async def work(broker: Broker) -> TopicConfig:
            return await broker.create_topic(new_topic(name, partitions, **config))

        topic: TopicConfig = self._run(work)
        return topic.public()

    def delete_topic(self, name: str) -> None:
        async def work(broker: Broker) -> None:
            await broker.delete_topic(name)

        self._run(work)

    def produce(self, topic: str, message: NewMessage, ack: AckMode) -> dict[str, Any]:
        async def work(broker: Broker) -> dict[str, Any]:
            # The embedded broker stops right after, committing to Delta: answer as for ack=table.
            from lakebroker.ingest_api.produce_core import THIS_NODE, ProduceCore, ProduceRequest

            # No peers to forward to: a partition another node owns is refused (NotOwner).
            core = ProduceCore(broker, router=None)
            result = await core.produce_one(ProduceRequest(
                topic, message, AckMode.TABLE if ack is AckMode.NONE else ack, THIS_NODE))
            return asdict(result)

        out: dict[str, Any] = self._run(work)
        return out

    def skip_lost(self, topic: str, partition: int) -> dict[str, Any]:
        async def work(broker: Broker) -> dict[str, Any]:
            loss = await broker.skip_lost(topic, partition, "cli")
            return {**asdict(loss), "skipped_at": loss.skipped_at.isoformat()}

        out: dict[str, Any] = self._run(work)
        return out


_ERRORS_BY_STATUS: dict[int, type[LakebrokerError]] = {
    400: InvalidRequest, 401: Unauthenticated, 403: Forbidden, 404: NotFound, 409: AlreadyExists, 413: TooLarge,
    422: InvalidRequest, 507: StorageUnavailable,
}


class RemoteAccess:
    def __init__(self, url: str, token: str | None = None, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.client = httpx.Client(base_url=url, timeout=30, headers=headers, transport=transport)
        self.has_token = token is not None

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise StorageUnavailable(f"the running server at {self.client.base_url} did not answer: {exc}") from None
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            if response.status_code == 429:
                raise Backpressure(message, float(response.headers.get("retry-after", "1")))
            if response.status_code == 401 and not self.has_token:
                message += " (the running server requires a token: set LAKEBROKER_TOKEN)"
            raise _ERRORS_BY_STATUS.get(response.status_code, LakebrokerError)(message)
        return response.json() if response.content else None

    def create_topic(self, name: str, partitions: int, config: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self._call("POST", "/v1/topics", json={"name": name, "partitions": partitions, **config})
        return out

    def delete_topic(self, name: str) -> None:
        self._call("DELETE", f"/v1/topics/{name}")

    def produce(self, topic: str, message: NewMessage, ack: AckMode) -> dict[str, Any]:
        body: dict[str, Any] = {"key": message.key, "headers": message.headers, "partition": message.partition,
                                "id": message.message_id}
        if message.format == "json" and message.value is not None:
            body["value"] = orjson.loads(message.value)
        else:
            body["value"] = None if message.value is None else message.value.decode()
        out: dict[str, Any] = self._call("POST", f"/v1/topics/{topic}/messages", params={"ack": ack.value},
                                         json={k: v for k, v in body.items() if v is not None or k == "value"})
        return out

    def skip_lost(self, topic: str, partition: int) -> dict[str, Any]:
        out: dict[str, Any] = self._call("POST", "/v1/wal/damage/skip", json={"topic": topic, "partition": partition})
        return out


def _live_peer(layout: Layout) -> str | None:
    """The URL of a live node of this table root's cluster other than this data dir's own node."""
    me = layout.node_file.read_text().strip() if layout.node_file.is_file() else None
    peers = sorted(n.url for n in read_view(layout).live_nodes().values() if n.node != me and n.url)
    return peers[0] if peers else None


@contextlib.contextmanager
def broker_access(settings: Settings, *, this_node: bool = False) -> Iterator[BrokerAccess]:
    """`this_node`: the command is about this data dir's own WAL, which only its own broker holds."""
    layout = Layout.of(settings)
    lock = DataDirLock(layout.lock_file)
    if lock.try_acquire():
        try:
            # Where other nodes serve the tables, an embedded broker would join their cluster for the
            # length of one command and move partitions twice: the command goes to one of them.
            peer = None if this_node else _live_peer(layout)
            if peer is not None:
                yield _remote(peer, settings)
                return
            yield EmbeddedAccess(settings)
        finally:
            lock.release()
        return
    try:
        url = orjson.loads(layout.server_file.read_bytes())["url"]
    except (OSError, ValueError, KeyError):
        raise StorageUnavailable(
            f"another process holds {layout.lock_file} but left no address in {layout.server_file}"
        ) from None
    yield _remote(url, settings)


def _remote(url: str, settings: Settings) -> RemoteAccess:
    return RemoteAccess(url, settings.token.get_secret_value() if settings.token is not None else None)
