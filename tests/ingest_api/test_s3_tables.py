"""Topics and `_system` tables on a real S3 server (MinIO): produce, pull and webhook delivery work,
the local data dir keeps only the WAL, dedup state and lock, and no secret is ever shown."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lakebroker.server import build_app
from lakebroker.tables import delta, storage
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from tests.receivers import Receiver
from tests.s3 import ACCESS_KEY, SECRET_KEY


@pytest.fixture
def s3_settings(tmp_path: Path, s3_root: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", tables_uri=s3_root, flush_interval_ms=20, allow_private_webhooks=True,
                    heartbeat_s=0.5, offset_commit_interval_ms=200, delivery_mode="inprocess")


@pytest.fixture
def s3_client(s3_settings: Settings) -> Iterator[TestClient]:
    with TestClient(build_app(s3_settings)) as c:
        yield c


def test_produce_pull_and_deliver_with_tables_on_s3(s3_client: TestClient, s3_settings: Settings,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = s3_client
    assert client.post("/v1/topics", json={"name": "orders", "partitions": 2}).status_code == 201
    receiver = Receiver()
    try:
        r = client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                                   "start": "earliest"})
        assert r.status_code == 201, r.text
        r = client.post("/v1/topics/orders/batch?ack=table",
                        json={"messages": [{"key": f"k{i % 5}", "value": {"n": i}, "id": f"m{i}"} for i in range(40)]})
        assert r.status_code == 200, r.text
        again = client.post("/v1/topics/orders/messages?ack=table", json={"value": {"n": 0}, "id": "m0"})
        assert again.json()["duplicate"] is True

        # Pull: every message, in offset order per partition.
        pulled = []
        for p in range(2):
            body = client.get(f"/v1/topics/orders/partitions/{p}/messages", params={"offset": 0, "limit": 100}).json()
            offsets = [m["offset"] for m in body["messages"]]
            assert offsets == list(range(len(offsets)))
            pulled += [m["value"]["n"] for m in body["messages"]]
        assert sorted(pulled) == list(range(40))

        # Push: the webhook receiver gets all 40.
        receiver.wait_for(lambda: len({m["id"] for m in receiver.messages()}) >= 40)
        assert {m["value"]["n"] for m in receiver.messages()} == set(range(40))

        # Every table is in the bucket; the data dir holds no table.
        layout = Layout.of(s3_settings)
        assert layout.topic_table("orders").startswith(s3_settings.tables_uri + "/")  # type: ignore[operator]
        table = delta.load(layout.topic_table("orders"))
        assert table.to_pyarrow_table(columns=["offset"]).num_rows == 40
        for system in (layout.topics_table, layout.subscriptions_table):
            assert delta.exists(system), system
        assert sorted(storage.child_names(s3_settings.tables_uri or "")) == ["_system", "topics"]
        assert not (s3_settings.data_dir / "topics").exists() and not (s3_settings.data_dir / "_system").exists()
        assert (s3_settings.data_dir / "wal").is_dir()

        # Nothing the API, the dashboard or the logs show carries the credentials.
        shown = [client.get(path).text for path in (
            "/v1/topics", "/v1/topics/orders", "/v1/subscriptions", "/v1/subscriptions/hooks", "/v1/dashboard",
            "/dashboard", "/metrics", "/readyz", "/openapi.json")]
        shown += [record.getMessage() for record in caplog.records]
        for text in shown:
            assert SECRET_KEY not in text and ACCESS_KEY not in text
    finally:
        receiver.close()
