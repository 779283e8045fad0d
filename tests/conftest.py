from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ingest_api import create_app
from tables.settings import Settings
from tests.s3 import s3_root, s3_server, s3_spark  # noqa: F401 - fixtures: one MinIO per test process


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Delivery on the test's own event loop: tests read the worker's live state (app.state.delivery).
    return Settings(data_dir=tmp_path / "data", flush_interval_ms=20, allow_private_webhooks=True, heartbeat_s=0.5,
                    offset_commit_interval_ms=200, delivery_mode="inprocess")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def orders(client: TestClient) -> str:
    r = client.post("/v1/topics", json={"name": "orders", "partitions": 3})
    assert r.status_code == 201, r.text
    return "orders"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a test marked `slow` run first: in parallel processes (scripts/test.sh) the
    suite then ends with short modules filling in, not with one long Spark chain started last."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the order within each group stays
