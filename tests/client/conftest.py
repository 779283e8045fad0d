"""A real `lakebroker serve` on loopback, shared by the client tests, with auth required."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from lakebroker.tables.layout import Layout
from lakebroker.tables.tokens import TokenStore
from tests.servers import ServerProcess

FAST = {"LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1", "LAKEBROKER_HEARTBEAT_S": "0.5",
        "LAKEBROKER_FLUSH_INTERVAL_MS": "50", "LAKEBROKER_OFFSET_COMMIT_INTERVAL_MS": "200"}


@dataclass
class Broker:
    url: str
    token: str | None
    data_dir: Path

    def admin(self) -> httpx.Client:
        headers = {"authorization": f"Bearer {self.token}"} if self.token else None
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def create_topic(self, name: str, partitions: int = 3) -> str:
        with self.admin() as c:
            r = c.post("/v1/topics", json={"name": name, "partitions": partitions})
            assert r.status_code == 201, r.text
        return name


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    data = tmp_path_factory.mktemp("client") / "data"
    data.mkdir()
    _, token = TokenStore(Layout(data)).create(["admin"], name="client tests")
    server = ServerProcess(data, env={**FAST, "LAKEBROKER_AUTH": "required"})
    url = server.start()
    yield Broker(url, token, data)
    server.stop()


def serves_consumer_groups(broker: Broker) -> bool:
    with broker.admin() as c:
        r = c.get("/v1/topics/no-such-topic/groups/g/offsets")
    return r.status_code == 404 and "does not exist" in r.text


@pytest.fixture(scope="session")
def group_broker(broker: Broker) -> Broker:
    """The shared `lakebroker serve`, which serves the consumer-group offsets API."""
    assert serves_consumer_groups(broker)
    return broker
