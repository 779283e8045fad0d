"""Every bad produce or admin request gets a precise JSON error and writes nothing."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from ingest_api import create_app
from tables.settings import Settings


def assert_error(response, status: int, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert needle in message, message


def assert_nothing_written(client: TestClient, topic: str = "orders") -> None:
    for p in client.get(f"/v1/topics/{topic}").json()["partition_offsets"]:
        assert p["log_end_offset"] == 0, p


def test_unknown_topic_is_404(client: TestClient) -> None:
    assert_error(client.post("/v1/topics/nope/messages", json={"value": 1}), 404, "'nope' does not exist")
    assert_error(client.post("/v1/topics/nope/batch", json={"messages": [{"value": 1}]}), 404, "does not exist")
    assert_error(client.get("/v1/topics/nope/partitions/0/messages"), 404, "does not exist")
    assert_error(client.patch("/v1/topics/nope", json={"retention_ms": 5}), 404, "does not exist")
    assert_error(client.delete("/v1/topics/nope"), 404, "does not exist")


@pytest.mark.parametrize("name", ["", "a" * 129, "..", "../etc", "a/b", "has space", "_system", "-x", "é"])
def test_invalid_topic_names_are_refused(client: TestClient, name: str) -> None:
    r = client.post("/v1/topics", json={"name": name})
    assert r.status_code in (400, 422), r.text
    assert "name" in r.json()["error"]["message"]
    assert client.get("/v1/topics").json() == []


def test_path_traversal_in_url_is_refused(client: TestClient, orders: str) -> None:
    r = client.post("/v1/topics/..%2F..%2Fetc/messages", json={"value": 1})
    assert r.status_code in (400, 404)
    r = client.post("/v1/topics/a%20b/messages", json={"value": 1})
    assert_error(r, 400, "invalid topic name")


def test_message_over_max_message_bytes_is_413(client: TestClient) -> None:
    client.post("/v1/topics", json={"name": "orders", "partitions": 1, "max_message_bytes": 10})
    assert_error(client.post("/v1/topics/orders/messages", json={"value": "x" * 11}), 413, "max_message_bytes 10")
    batch = {"messages": [{"value": "ok"}, {"value": "y" * 50}]}
    assert_error(client.post("/v1/topics/orders/batch", json=batch), 413, "message 1")
    assert_nothing_written(client)


def test_body_over_server_limit_is_413(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path / "d", max_request_bytes=1000)
    with TestClient(create_app(settings)) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1})
        big = b'{"value": "' + b"x" * 2000 + b'"}'
        assert_error(client.post("/v1/topics/orders/messages", content=big,
                                 headers={"content-type": "application/json"}), 413, "server limit of 1000")

        def chunks():  # type: ignore[no-untyped-def]
            yield b'{"value": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}'

        r = client.post("/v1/topics/orders/messages", content=chunks(), headers={"content-type": "application/json"})
        assert_error(r, 413, "server limit of 1000")
        assert_nothing_written(client)


def test_malformed_json_is_400(client: TestClient, orders: str) -> None:
    for path in ("messages", "batch"):
        r = client.post(f"/v1/topics/{orders}/{path}", content=b'{"value": ',
                        headers={"content-type": "application/json"})
        assert_error(r, 400, "malformed JSON")
    r = client.post(f"/v1/topics/{orders}/batch", content=b'{"value": 1}\n{oops',
                    headers={"content-type": "application/x-ndjson"})
    assert_error(r, 400, "line 2")
    assert_nothing_written(client)


def test_wrong_shape_is_422(client: TestClient, orders: str) -> None:
    assert_error(client.post(f"/v1/topics/{orders}/messages", json={"key": "k"}), 422, "value is required")
    assert_error(client.post(f"/v1/topics/{orders}/messages", json={"value": 1, "bogus": 2}), 422, "bogus")
    assert_error(client.post(f"/v1/topics/{orders}/messages", json={"value": 1, "value_b64": "AA=="}), 422, "not both")
    assert_error(client.post(f"/v1/topics/{orders}/batch", json={"messages": []}), 422, "messages")
    assert_error(client.post(f"/v1/topics/{orders}/messages", json={"value_b64": "***"}), 400, "base64")
    assert_error(client.post(f"/v1/topics/{orders}/messages", json={"value": 1, "producer_id": "p"}), 400,
                 "together")
    assert_nothing_written(client)


def test_partition_out_of_range_is_400(client: TestClient, orders: str) -> None:
    assert_error(client.post(f"/v1/topics/{orders}/messages", json={"value": 1, "partition": 3}), 400,
                 "partition 3 is out of range")
    assert_error(client.get(f"/v1/topics/{orders}/partitions/9/messages"), 400, "out of range")
    assert_nothing_written(client)


def test_wrong_content_type_is_415(client: TestClient, orders: str) -> None:
    r = client.post(f"/v1/topics/{orders}/messages", content=b"value=1",
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert_error(r, 415, "application/json")
    r = client.post(f"/v1/topics/{orders}/batch", content=b"1", headers={"content-type": "text/plain"})
    assert_error(r, 415, "application/x-ndjson")
    assert_nothing_written(client)


def test_bad_topic_config_is_refused(client: TestClient) -> None:
    assert client.post("/v1/topics", json={"name": "x", "partitions": 0}).status_code == 422
    assert client.post("/v1/topics", json={"name": "x", "partitions": 5000}).status_code == 422
    assert client.post("/v1/topics", json={"name": "x", "cleanup_policy": "shred"}).status_code == 422
    assert client.post("/v1/topics", json={"name": "x", "retention_ms": -1}).status_code == 422
    assert client.get("/v1/topics").json() == []


def test_backlog_over_bound_is_429_with_retry_after(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path / "d", max_backlog_bytes=1, flush_interval_ms=60_000,
                        flush_max_records=10**9, flush_max_bytes=10**9)
    with TestClient(create_app(settings)) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1})
        assert client.post("/v1/topics/orders/messages", json={"value": "first"}).status_code == 200
        r = client.post("/v1/topics/orders/messages", json={"value": "second"})
        assert_error(r, 429, "retry after")
        assert int(r.headers["retry-after"]) >= 1
        assert client.get("/readyz").status_code == 503
