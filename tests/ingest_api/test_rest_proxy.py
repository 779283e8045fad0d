"""Kafka REST Proxy v2: topic metadata, produce to a partition, per-record errors, and every error
(auth included) in the proxy's `{error_code, message}` shape, over HTTP against the app."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from lakebroker.ingest_api.partitioner import partition_for_key
from lakebroker.server import build_app
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import TokenStore
from tests.ingest_api.test_produce_api import read_all

V2 = "application/vnd.kafka.v2+json"
JSON_V2 = {"content-type": "application/vnd.kafka.json.v2+json"}
BINARY_V2 = {"content-type": "application/vnd.kafka.binary.v2+json"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def assert_v2_error(r: httpx.Response, status: int, error_code: int, text: str = "") -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == V2
    body = r.json()
    assert set(body) == {"error_code", "message"}, body
    assert body["error_code"] == error_code, body
    assert text in body["message"], body


def produce(client: TestClient, path: str, records: list[dict], headers: dict[str, str] = JSON_V2) -> httpx.Response:
    return client.post(path, content=orjson.dumps({"records": records}), headers=headers)


def test_list_topics_and_describe_one(client: TestClient, orders: str) -> None:
    client.post("/v1/topics", json={"name": "audit", "partitions": 2, "cleanup_policy": "compact",
                                    "retention_ms": None, "max_message_bytes": 500})
    r = client.get("/topics")
    assert r.status_code == 200 and r.headers["content-type"] == V2
    assert r.json() == ["audit", "orders"]
    r = client.get("/topics/audit")
    assert r.status_code == 200 and r.headers["content-type"] == V2
    body = r.json()
    assert body["name"] == "audit"
    assert body["configs"] == {"cleanup.policy": "compact", "retention.ms": "-1", "retention.bytes": "-1",
                               "max.message.bytes": "500", "delete.retention.ms": "86400000"}
    replicas = [{"broker": 0, "leader": True, "in_sync": True}]
    assert body["partitions"] == [{"partition": p, "leader": 0, "replicas": replicas} for p in (0, 1)]
    assert client.get(f"/topics/{orders}").json()["configs"]["retention.ms"] == "604800000"
    assert_v2_error(client.get("/topics/nope"), 404, 40401, "'nope' does not exist")


def test_produce_to_a_partition(client: TestClient, orders: str) -> None:
    keys = ["a", "b", "c", "d"]
    assert {partition_for_key(k, 3) for k in keys} != {2}  # the path, not the key, picks the partition
    r = produce(client, f"/topics/{orders}/partitions/2", [{"key": k, "value": {"n": i}} for i, k in enumerate(keys)])
    assert r.status_code == 200 and r.headers["content-type"] == V2
    assert r.json()["offsets"] == [{"partition": 2, "offset": i, "error_code": None, "error": None} for i in range(4)]
    r = produce(client, f"/topics/{orders}/partitions/2", [{"value": b64(b"\x00\xff")}], BINARY_V2)
    assert r.json()["offsets"][0]["offset"] == 4
    stored = read_all(client, orders, 2)
    assert [(m["key"], m["value"]) for m in stored[:4]] == [(k, {"n": i}) for i, k in enumerate(keys)]
    assert stored[4]["value_b64"] == b64(b"\x00\xff")
    for p in (0, 1):
        assert read_all(client, orders, p) == []

    assert_v2_error(produce(client, f"/topics/{orders}/partitions/3", [{"value": 1}]), 404, 40402,
                    "partition 3 does not exist")
    assert_v2_error(produce(client, "/topics/nope/partitions/0", [{"value": 1}]), 404, 40401, "does not exist")
    assert_v2_error(produce(client, f"/topics/{orders}/partitions/0", [{"value": 1, "partition": 0}]), 422, 42201,
                    "no 'partition' field")
    r = client.post(f"/topics/{orders}/partitions/x", content=b'{"records": [{"value": 1}]}', headers=JSON_V2)
    assert_v2_error(r, 422, 42201, "partition")


def test_one_bad_record_gets_its_error_in_its_slot_and_the_others_are_written(client: TestClient) -> None:
    client.post("/v1/topics", json={"name": "small", "partitions": 2, "max_message_bytes": 20})
    r = produce(client, "/topics/small", [
        {"value": "ok-0", "partition": 0},
        {"value": "x" * 21, "partition": 0},  # over max.message.bytes
        {"value": "ok-1", "partition": 0},
        {"value": "ok-2", "partition": 5},  # no such partition
        {"value": "ok-3", "partition": 0},
    ])
    huge = client.post("/topics/small", headers=JSON_V2,
                       content=b'{"records": [{"value": 123456789012345678901234567890, "partition": 0}]}')
    assert huge.status_code == 200 and huge.json()["offsets"][0]["error_code"] == 50002
    assert "cannot be stored as JSON" in huge.json()["offsets"][0]["error"]
    huge = client.post("/topics/small", headers=JSON_V2,
                       content=b'{"records": [{"key": [123456789012345678901234567890], "value": 1, "partition": 0}]}')
    assert huge.status_code == 200 and "key cannot be stored" in huge.json()["offsets"][0]["error"]
    assert r.status_code == 200, r.text
    offsets = r.json()["offsets"]
    assert offsets[0] == {"partition": 0, "offset": 0, "error_code": None, "error": None}
    assert offsets[1]["partition"] is None and offsets[1]["offset"] is None
    assert offsets[1]["error_code"] == 50002 and "max.message.bytes 20" in offsets[1]["error"]
    assert offsets[2] == {"partition": 0, "offset": 1, "error_code": None, "error": None}
    assert offsets[3]["error_code"] == 50002 and "partition 5 does not exist" in offsets[3]["error"]
    assert offsets[4] == {"partition": 0, "offset": 2, "error_code": None, "error": None}

    r = produce(client, "/topics/small/partitions/1", [
        {"value": b64(b"one")}, {"value": "%%not base64%%"}, {"key": b64(b"\xff\xfe"), "value": b64(b"k")},
        {"value": b64(b"two")},
    ], BINARY_V2)
    assert r.status_code == 200, r.text
    offsets = r.json()["offsets"]
    assert [(o["partition"], o["offset"], o["error_code"]) for o in offsets] == [
        (1, 0, None), (None, None, 50002), (None, None, 50002), (1, 1, None)]
    assert "not valid base64" in offsets[1]["error"] and "UTF-8" in offsets[2]["error"]

    # Only the good records are in the log, with dense offsets.
    assert [m["value"] for m in read_all(client, "small", 0)] == ["ok-0", "ok-1", "ok-3"]
    assert [m["value_b64"] for m in read_all(client, "small", 1)] == [b64(b"one"), b64(b"two")]

    # Every record bad: still 200, nothing written.
    r = produce(client, "/topics/small", [{"value": "y" * 50, "partition": 0}])
    assert r.status_code == 200 and r.json()["offsets"][0]["error_code"] == 50002
    assert client.get("/v1/topics/small").json()["partition_offsets"][0]["log_end_offset"] == 3


def test_request_errors_answer_in_the_proxys_shape(tmp_path: Path) -> None:
    # A flush interval no test waits out: the backlog stays above max_backlog_bytes after one produce.
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=600_000, max_backlog_bytes=1,
                        max_request_bytes=4096, deliver_in_serve=False)
    with TestClient(build_app(settings)) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1})
        assert_v2_error(client.post("/topics/orders", content=b'{"records": [', headers=JSON_V2), 400, 40001,
                        "malformed JSON")
        r = client.post("/topics/orders", content=b'{"records": [{"value": NaN}]}', headers=JSON_V2)
        assert_v2_error(r, 400, 40001, "malformed JSON")
        assert_v2_error(client.post("/topics/orders", content=b"{}", headers={"content-type": "application/json"}),
                        415, 41501, "not supported")
        assert_v2_error(client.post("/topics/orders", content=b'{"records": []}', headers=JSON_V2), 422, 42201,
                        "1 to 100000 records")
        assert_v2_error(client.post("/topics/orders", content=b'{"records": [1]}', headers=JSON_V2), 422, 42201,
                        "must be an object")
        assert_v2_error(client.post("/topics/orders", content=b"x" * 5000, headers=JSON_V2), 413, 41301)
        assert_v2_error(client.get("/topics/orders/nothing-here"), 404, 40401)
        assert_v2_error(client.delete("/topics/orders"), 405, 40501)
        assert produce(client, "/topics/orders", [{"value": 1}]).status_code == 200
        r = produce(client, "/topics/orders", [{"value": 2}])
        assert_v2_error(r, 429, 42901, "retry after")
        assert int(r.headers["retry-after"]) >= 1
        # The v1 API keeps its own shape.
        r = client.post("/v1/topics/orders/messages", json={"value": 3})
        assert r.status_code == 429 and r.json()["error"]["code"] == "backpressure"


@pytest.fixture
def authed(tmp_path: Path) -> Iterator[tuple[TestClient, TokenStore]]:
    data = tmp_path / "data"
    store = TokenStore(Layout(data))
    _, admin = store.create(["admin"])
    settings = Settings(data_dir=data, auth="required", auth_cache_ms=0, flush_interval_ms=20,
                        deliver_in_serve=False)
    with TestClient(build_app(settings)) as client:
        for name in ("orders", "other"):
            r = client.post("/v1/topics", json={"name": name, "partitions": 2}, headers=bearer(admin))
            assert r.status_code == 201, r.text
        yield client, store


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_auth_failures_on_v2_routes(authed: tuple[TestClient, TokenStore]) -> None:
    client, store = authed
    for method, path in (("GET", "/topics"), ("GET", "/topics/orders"), ("POST", "/topics/orders"),
                         ("POST", "/topics/orders/partitions/0"), ("GET", "/topics/orders/no-such-route")):
        r = client.request(method, path, content=b'{"records": [{"value": 1}]}', headers=JSON_V2)
        assert_v2_error(r, 401, 40101, "API token")
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = client.request(method, path, headers={**JSON_V2, **bearer("lbk_000000000000_" + "A" * 43)})
        assert_v2_error(r, 401, 40101)
        assert 'error="invalid_token"' in r.headers["www-authenticate"]

    _, consumer = store.create(["consume"])
    for path in ("/topics/orders", "/topics/orders/partitions/0"):
        r = produce(client, path, [{"value": 1}], {**JSON_V2, **bearer(consumer)})
        assert_v2_error(r, 403, 40301, "produce scope")
        assert 'scope="produce"' in r.headers["www-authenticate"]
    assert client.get("/topics", headers=bearer(consumer)).json() == ["orders", "other"]

    _, limited = store.create(["produce"], topics=["ord*"])
    assert client.get("/topics", headers=bearer(limited)).json() == ["orders"]
    assert client.get("/topics/orders", headers=bearer(limited)).status_code == 200
    assert_v2_error(client.get("/topics/other", headers=bearer(limited)), 403, 40301, "may not use topic 'other'")
    r = produce(client, "/topics/other/partitions/0", [{"value": 1}], {**JSON_V2, **bearer(limited)})
    assert_v2_error(r, 403, 40301, "may not use topic 'other'")
    r = produce(client, "/topics/orders/partitions/1", [{"value": 1}], {**JSON_V2, **bearer(limited)})
    assert r.status_code == 200 and r.json()["offsets"][0] == {"partition": 1, "offset": 0, "error_code": None,
                                                                "error": None}


def test_a_record_that_breaks_the_schema_fails_the_request(client: TestClient, orders: str) -> None:
    for partition in ("1", -1, 1024, True, [0]):
        r = produce(client, f"/topics/{orders}", [{"value": 1}, {"value": 2, "partition": partition}])
        assert_v2_error(r, 422, 42201, "partition must be an integer")
    assert client.get(f"/v1/topics/{orders}").json()["partition_offsets"][0]["log_end_offset"] == 0
