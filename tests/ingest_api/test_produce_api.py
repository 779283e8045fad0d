from __future__ import annotations

import base64
from datetime import datetime

import orjson
from fastapi.testclient import TestClient

from lakebroker.ingest_api.partitioner import partition_for_key
from lakebroker.server import build_app
from tests.waiting import eventually


def read_all(client: TestClient, topic: str, partition: int) -> list[dict]:
    """Every message of a partition, once all it was sent is committed to its table."""
    def committed() -> tuple[list[dict]] | None:  # a tuple: true even when the partition holds nothing
        r = client.get(f"/v1/topics/{topic}/partitions/{partition}/messages", params={"offset": 0, "limit": 10000})
        assert r.status_code == 200, r.text
        body = r.json()
        end = client.get(f"/v1/topics/{topic}").json()["partition_offsets"][partition]["log_end_offset"]
        return (body["messages"],) if body["committed_offset"] == end else None

    return eventually(committed, 10, what=f"{topic}[{partition}] committed", interval=0.02)[0]


def test_topic_admin_round_trip(client: TestClient) -> None:
    r = client.post("/v1/topics", json={"name": "t1", "partitions": 2, "retention_ms": 1000,
                                         "cleanup_policy": "compact", "max_message_bytes": 100})
    assert r.status_code == 201
    assert r.json()["cleanup_policy"] == "compact"
    assert [t["name"] for t in client.get("/v1/topics").json()] == ["t1"]
    detail = client.get("/v1/topics/t1").json()
    assert [p["partition"] for p in detail["partition_offsets"]] == [0, 1]
    assert detail["partition_offsets"][0]["log_end_offset"] == 0
    r = client.patch("/v1/topics/t1", json={"partitions": 4, "retention_ms": 5000})
    assert r.status_code == 200 and r.json()["partitions"] == 4 and r.json()["retention_ms"] == 5000
    assert client.patch("/v1/topics/t1", json={"partitions": 1}).status_code == 400
    assert client.post("/v1/topics", json={"name": "t1"}).status_code == 409
    assert client.delete("/v1/topics/t1").status_code == 204
    assert client.get("/v1/topics/t1").status_code == 404


def test_keyed_messages_land_on_kafkas_partition_with_dense_offsets(client: TestClient, orders: str) -> None:
    results = []
    for i in range(30):
        r = client.post(f"/v1/topics/{orders}/messages", json={"key": f"user-{i % 5}", "value": {"n": i}})
        assert r.status_code == 200
        results.append(r.json())
    for i, res in enumerate(results):
        assert res["partition"] == partition_for_key(f"user-{i % 5}", 3)
    for p in range(3):
        offsets = sorted(r["offset"] for r in results if r["partition"] == p)
        assert offsets == list(range(len(offsets)))
        stored = read_all(client, orders, p)
        assert [m["offset"] for m in stored] == offsets


def test_batch_json_and_ndjson_answer_in_request_order(client: TestClient, orders: str) -> None:
    r = client.post(f"/v1/topics/{orders}/batch", json={"messages": [{"value": i, "partition": i % 3}
                                                                       for i in range(9)]})
    assert r.status_code == 200
    res = r.json()["results"]
    assert [x["partition"] for x in res] == [i % 3 for i in range(9)]
    assert [x["offset"] for x in res] == [i // 3 for i in range(9)]
    ndjson = b"\n".join(orjson.dumps({"value": f"line {i}", "partition": 0}) for i in range(4))
    r = client.post(f"/v1/topics/{orders}/batch", content=ndjson, headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 200
    assert [x["offset"] for x in r.json()["results"]] == [3, 4, 5, 6]
    stored = read_all(client, orders, 0)
    assert [m["value"] for m in stored] == [0, 3, 6, "line 0", "line 1", "line 2", "line 3"]


def test_values_keep_their_format(client: TestClient, orders: str) -> None:
    raw = bytes(range(256))
    for body in ({"value": "text", "partition": 1, "headers": {"a": "b"}}, {"value": [1, {"x": None}], "partition": 1},
                 {"value_b64": base64.b64encode(raw).decode(), "partition": 1}):
        assert client.post(f"/v1/topics/{orders}/messages", json=body).status_code == 200
    r = client.post(f"/v1/topics/{orders}/messages?partition=1&key=bin", content=raw,
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200 and r.json()["offset"] == 3
    client.post(f"/v1/topics/{orders}/messages", json={"key": "gone", "value": None, "partition": 1})
    stored = read_all(client, orders, 1)
    assert stored[0]["value"] == "text" and stored[0]["format"] == "text" and stored[0]["headers"] == {"a": "b"}
    assert stored[1]["value"] == [1, {"x": None}] and stored[1]["format"] == "json"
    assert base64.b64decode(stored[2]["value_b64"]) == raw
    assert base64.b64decode(stored[3]["value_b64"]) == raw and stored[3]["key"] == "bin"
    assert stored[4]["value"] is None and stored[4]["key"] == "gone"


def test_ack_table_is_visible_immediately(client: TestClient, orders: str) -> None:
    r = client.post(f"/v1/topics/{orders}/messages?ack=table", json={"value": "now", "partition": 2})
    assert r.status_code == 200
    body = client.get(f"/v1/topics/{orders}/partitions/2/messages", params={"offset": 0}).json()
    assert [m["value"] for m in body["messages"]] == ["now"]


def test_ack_none_is_accepted_and_eventually_stored(client: TestClient, orders: str) -> None:
    r = client.post(f"/v1/topics/{orders}/messages?ack=none", json={"value": "later", "partition": 0})
    assert r.status_code == 202
    assert r.json()["offset"] is None and r.json()["partition"] == 0
    assert [m["value"] for m in read_all(client, orders, 0)] == ["later"]


def test_duplicate_ids_return_the_original_offset(client: TestClient, orders: str) -> None:
    first = client.post(f"/v1/topics/{orders}/messages", json={"value": 1, "id": "abc"}).json()
    again = client.post(f"/v1/topics/{orders}/messages", json={"value": 1, "id": "abc"}).json()
    assert again == {**first, "duplicate": True}
    seq1 = client.post(f"/v1/topics/{orders}/messages", json={"value": 2, "producer_id": "p", "sequence": 1}).json()
    seq1b = client.post(f"/v1/topics/{orders}/messages", json={"value": 2, "producer_id": "p", "sequence": 1}).json()
    assert seq1b["offset"] == seq1["offset"] and seq1b["duplicate"]
    batch = client.post(f"/v1/topics/{orders}/batch", json={"messages": [
        {"value": 3, "id": "x"}, {"value": 3, "id": "x"}, {"value": 4, "id": "abc"}]}).json()["results"]
    assert batch[1]["offset"] == batch[0]["offset"] and batch[1]["duplicate"]
    assert batch[2]["offset"] == first["offset"] and batch[2]["duplicate"]
    total = sum(len(read_all(client, orders, p)) for p in range(3))
    assert total == 3


def test_batch_results_carry_the_stored_timestamp_and_a_duplicate_the_original(client: TestClient,
                                                                               orders: str) -> None:
    first = client.post(f"/v1/topics/{orders}/batch?ack=table", json={"messages": [
        {"value": 1, "id": "t1", "partition": 0}, {"value": 2, "partition": 0}]}).json()["results"]
    stored = read_all(client, orders, 0)
    assert [r["timestamp"] for r in first] == [m["timestamp"] for m in stored]
    assert datetime.fromisoformat(first[0]["timestamp"]).tzinfo is not None
    again = client.post(f"/v1/topics/{orders}/batch", json={"messages": [
        {"value": 3, "partition": 0}, {"value": 1, "id": "t1", "partition": 0}]}).json()["results"]
    assert again[1] == {**first[0], "duplicate": True}, "a duplicate answers the original log-append time"
    assert again[0]["timestamp"] >= first[1]["timestamp"]
    later = client.post(f"/v1/topics/{orders}/batch?ack=none", json={"messages": [{"value": 4}]}).json()
    assert later["results"][0]["timestamp"] is None and later["results"][0]["offset"] is None


def test_duplicates_are_detected_across_restarts(settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with TestClient(build_app(settings)) as c:
        c.post("/v1/topics", json={"name": "o", "partitions": 2})
        flushed = c.post("/v1/topics/o/messages?ack=table", json={"value": 1, "id": "in-delta"}).json()
        in_wal = c.post("/v1/topics/o/messages", json={"value": 2, "id": "maybe-in-wal"}).json()
        stamped = c.post("/v1/topics/o/batch", json={"messages": [{"value": 3, "id": "b"}]}).json()["results"]
    with TestClient(build_app(settings)) as c:
        assert c.post("/v1/topics/o/messages", json={"value": 1, "id": "in-delta"}).json() == {
            **flushed, "duplicate": True}
        assert c.post("/v1/topics/o/messages", json={"value": 2, "id": "maybe-in-wal"}).json() == {
            **in_wal, "duplicate": True}
        again = c.post("/v1/topics/o/batch", json={"messages": [{"value": 3, "id": "b"}]}).json()["results"]
        assert again == [{**stamped[0], "duplicate": True}], "the original timestamp, rebuilt at start"
        assert sum(len(read_all(c, "o", p)) for p in range(2)) == 3


def test_pull_consume_by_timestamp_and_out_of_range(client: TestClient, orders: str) -> None:
    for i in range(3):
        client.post(f"/v1/topics/{orders}/messages?ack=table", json={"value": i, "partition": 0})
    read = client.get(f"/v1/topics/{orders}/partitions/0/messages", params={"offset": 0}).json()["messages"]
    second_ts = read[1]["timestamp"]
    by_time = client.get(f"/v1/topics/{orders}/partitions/0/messages", params={"timestamp": second_ts}).json()
    assert [m["offset"] for m in by_time["messages"]] == [1, 2]
    future = client.get(f"/v1/topics/{orders}/partitions/0/messages", params={"timestamp": "2999-01-01T00:00:00Z"})
    assert future.json()["messages"] == [] and future.json()["next_offset"] == 3
    at_end = client.get(f"/v1/topics/{orders}/partitions/0/messages", params={"offset": 3}).json()
    assert at_end["messages"] == [] and at_end["next_offset"] == 3
    beyond = client.get(f"/v1/topics/{orders}/partitions/0/messages", params={"offset": 4})
    assert beyond.status_code == 416 and "0 to 3" in beyond.json()["error"]["message"]
    limited = client.get(f"/v1/topics/{orders}/partitions/0/messages", params={"offset": 0, "limit": 2}).json()
    assert [m["offset"] for m in limited["messages"]] == [0, 1] and limited["next_offset"] == 2


def test_rest_proxy_v2_json_and_binary(client: TestClient, orders: str) -> None:
    r = client.post(f"/topics/{orders}", content=orjson.dumps({"records": [{"key": "k", "value": {"a": 1}},
                                                                           {"value": "x", "partition": 1}]}),
                    headers={"content-type": "application/vnd.kafka.json.v2+json"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/vnd.kafka.v2+json")
    body = r.json()
    assert body["key_schema_id"] is None
    assert body["offsets"][0] == {"partition": partition_for_key("k", 3), "offset": 0, "error_code": None,
                                  "error": None}
    assert body["offsets"][1]["partition"] == 1
    b64 = base64.b64encode(b"\x00\x01").decode()
    r = client.post(f"/topics/{orders}", content=orjson.dumps({"records": [{"value": b64, "partition": 2}]}),
                    headers={"content-type": "application/vnd.kafka.binary.v2+json"})
    assert r.status_code == 200
    assert r.json()["offsets"][0]["offset"] == (1 if partition_for_key("k", 3) == 2 else 0)
    missing = client.post("/topics/nope", content=b'{"records":[{"value":1}]}',
                          headers={"content-type": "application/vnd.kafka.json.v2+json"})
    assert missing.status_code == 404 and missing.json()["error_code"] == 40401
    avro = client.post(f"/topics/{orders}", content=b"{}",
                       headers={"content-type": "application/vnd.kafka.avro.v2+json"})
    assert avro.status_code == 415


def test_health_ready_and_metrics(client: TestClient, orders: str) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    client.post(f"/v1/topics/{orders}/messages?ack=table", json={"value": 1, "partition": 0})
    text = client.get("/metrics").text
    for name in ("lakebroker_produce_messages_total", "lakebroker_produce_latency_seconds_bucket",
                 "lakebroker_wal_backlog_bytes", "lakebroker_flush_latency_seconds_bucket",
                 "lakebroker_flush_batch_records_bucket", "lakebroker_partition_log_end_offset",
                 "lakebroker_partition_high_watermark", "lakebroker_partition_committed_offset"):
        assert name in text, name
    assert 'lakebroker_partition_log_end_offset{partition="0",topic="orders"} 1.0' in text
    # ack=table: the message is in Delta, so the committed end is past it, under both of its names
    assert 'lakebroker_partition_high_watermark{partition="0",topic="orders"} 1.0' in text
    assert 'lakebroker_partition_committed_offset{partition="0",topic="orders"} 1.0' in text


def test_a_hole_in_a_topic_that_is_not_compacted_is_an_error_not_a_skip(client: TestClient) -> None:
    """Only key compaction removes rows inside the log; any other hole is damage, reported."""
    from deltalake import DeltaTable

    for name, policy in (("plain", "delete"), ("compacted", "compact")):
        client.post("/v1/topics", json={"name": name, "partitions": 1, "cleanup_policy": policy})
        client.post(f"/v1/topics/{name}/batch?ack=table",
                    json={"messages": [{"value": i, "key": f"k{i}"} for i in range(6)]})
        uri = client.app.state.broker.layout.topic_table(name)  # type: ignore[attr-defined]
        DeltaTable(uri).delete("`offset` IN (2, 3)")
    r = client.get("/v1/topics/plain/partitions/0/messages", params={"offset": 0})
    assert r.status_code == 500 and r.json()["error"]["code"] == "offset_gap", r.text
    assert "missing offsets 2-3" in r.json()["error"]["message"]
    assert client.get("/v1/topics/plain/partitions/0/messages", params={"offset": 4}).status_code == 200
    compacted = client.get("/v1/topics/compacted/partitions/0/messages", params={"offset": 0}).json()
    assert [m["offset"] for m in compacted["messages"]] == [0, 1, 4, 5] and compacted["next_offset"] == 6
