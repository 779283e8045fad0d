"""A message's size is its key, value and headers, wherever it is measured: the topic's
max_message_bytes, the WAL backlog bound and the flusher's early-commit threshold."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from lakebroker.server import build_app
from lakebroker.tables.settings import Settings


def assert_nothing_written(client: TestClient, topic: str) -> None:
    for p in client.get(f"/v1/topics/{topic}").json()["partition_offsets"]:
        assert p["log_end_offset"] == 0, p


def test_headers_over_max_message_bytes_are_413(client: TestClient) -> None:
    client.post("/v1/topics", json={"name": "small", "partitions": 1, "max_message_bytes": 1024})
    big_value = {"value": "v", "headers": {"h": "x" * 2000}}
    r = client.post("/v1/topics/small/messages", json=big_value)
    assert r.status_code == 413, r.text
    message = r.json()["error"]["message"]
    assert "headers" in message and "max_message_bytes 1024" in message, message

    many_names = {"value": "v", "headers": {f"header-{i:04d}": "" for i in range(200)}}  # names alone: 2,200 B
    r = client.post("/v1/topics/small/batch", json={"messages": [{"value": "ok"}, many_names]})
    assert r.status_code == 413, r.text
    assert "message 1" in r.json()["error"]["message"]
    assert_nothing_written(client, "small")

    fits = {"value": "v", "headers": {"h": "x" * 900}}
    assert client.post("/v1/topics/small/messages", json=fits).status_code == 200


def test_headers_count_toward_the_backlog_bound(tmp_path: Path) -> None:
    # Nothing is flushed during the test, so every accepted byte stays in the backlog.
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=600_000, max_backlog_bytes=20_000,
                        deliver_in_serve=False)
    with TestClient(build_app(settings)) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1})
        statuses = [
            client.post("/v1/topics/orders/messages", json={"value": "v", "headers": {"h": "x" * 1000}}).status_code
            for _ in range(40)
        ]
        assert 429 in statuses, f"40 messages with 1 KB of headers each never hit a 20 KB backlog: {statuses}"
        accepted = statuses.index(429)
        assert 16 <= accepted <= 21, f"{accepted} accepted before the first 429"
