"""Every bad produce or admin request gets a precise JSON error and writes nothing."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from lakebroker.server import build_app
from lakebroker.tables.dead_letters import DeadLetter, DeadLetterTable
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from tests.servers import ServerProcess


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


def test_requests_for_unknown_topics_never_read_storage(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request naming a topic this node does not know is answered from memory: reading the topic
    table for it (on the event loop) let a burst of them stall every connection of the node."""
    broker = client.app.state.broker  # type: ignore[attr-defined]
    loads: list[str] = []
    monkeypatch.setattr(broker.store, "load", lambda: loads.append("load") or {})
    assert_error(client.post("/v1/topics/nope/messages", json={"value": 1}), 404, "'nope' does not exist")
    assert_error(client.get("/v1/topics/nope"), 404, "'nope' does not exist")
    assert_error(client.post("/v1/topics/a%20b/messages", json={"value": 1}), 400, "invalid topic name")
    assert loads == []


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
    with TestClient(build_app(settings)) as client:
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
    with TestClient(build_app(settings)) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1})
        assert client.post("/v1/topics/orders/messages", json={"value": "first"}).status_code == 200
        r = client.post("/v1/topics/orders/messages", json={"value": "second"})
        assert_error(r, 429, "retry after")
        assert int(r.headers["retry-after"]) >= 1
        assert client.get("/readyz").status_code == 503


HOOK = {"name": "hooks", "topic": "orders", "url": "http://127.0.0.1:9/hook"}


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_retry_delays_are_422(client: TestClient, orders: str, token: bytes) -> None:
    """Python's JSON parser takes NaN and Infinity; a retry delay must be a finite number."""
    body = b'{"name": "hooks", "topic": "orders", "url": "http://127.0.0.1:9/hook", "retry_schedule_s": [1, %s]}'
    r = client.post("/v1/subscriptions", content=body % token, headers={"content-type": "application/json"})
    assert_error(r, 422, "retry_schedule_s.1")
    assert client.get("/v1/subscriptions").json() == []
    assert client.post("/v1/subscriptions", json=HOOK).status_code == 201
    r = client.patch("/v1/subscriptions/hooks", content=b'{"retry_schedule_s": [%s]}' % token,
                     headers={"content-type": "application/json"})
    assert_error(r, 422, "retry_schedule_s.0")
    for field in (b"timeout_s", b"rate_limit_per_s"):
        r = client.patch("/v1/subscriptions/hooks", content=b'{"%s": %s}' % (field, token),
                         headers={"content-type": "application/json"})
        assert_error(r, 422, field.decode())
    assert client.get("/v1/subscriptions/hooks").json()["retry_schedule_ms"][0] == 5000  # unchanged


def _with_a_dead_letter(client: TestClient, settings: Settings) -> None:
    assert client.post("/v1/subscriptions", json=HOOK).status_code == 201
    letter = DeadLetter.from_exhausted_retries("hooks", "orders", 1, 0, 3, 500, "boom")
    DeadLetterTable(Layout(settings.data_dir)).add([letter])  # the table exists, so a filter reaches it


@pytest.mark.parametrize("partition", [2**31, 2**63, 10**30])
def test_huge_dead_letter_partition_is_422(client: TestClient, orders: str, settings: Settings,
                                           partition: int) -> None:
    _with_a_dead_letter(client, settings)
    assert_error(client.get(f"/v1/subscriptions/hooks/dead-letters?partition={partition}"), 422, "partition")
    assert_error(client.post("/v1/subscriptions/hooks/dead-letters/replay", json={"partition": partition}), 422,
                 "partition")


def test_dead_letter_partition_outside_the_topic_is_400(client: TestClient, orders: str, settings: Settings) -> None:
    _with_a_dead_letter(client, settings)
    assert_error(client.get("/v1/subscriptions/hooks/dead-letters?partition=3"), 400, "partition 3 is out of range")
    assert_error(client.post("/v1/subscriptions/hooks/dead-letters/replay", json={"partition": 3}), 400,
                 "partition 3 is out of range")


@pytest.mark.parametrize("offset", [2**63, 10**30])
@pytest.mark.parametrize("field", ["from_offset", "to_offset"])
def test_huge_replay_offsets_are_422(client: TestClient, orders: str, settings: Settings, field: str,
                                     offset: int) -> None:
    _with_a_dead_letter(client, settings)
    r = client.post("/v1/subscriptions/hooks/dead-letters/replay", json={"partition": 1, field: offset})
    assert_error(r, 422, field)
    r = client.post("/v1/subscriptions/hooks/dead-letters/replay", json={"partition": 1, "from_offset": 0})
    assert r.json() == {"requested": 1}  # nothing was marked by the refused requests


@pytest.fixture(scope="module")
def quick_body_deadline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A real `lakebroker serve` whose request bodies must arrive within 1 s."""
    proc = ServerProcess(tmp_path_factory.mktemp("body-deadline") / "data",
                         env={"LAKEBROKER_DELIVER_IN_SERVE": "false", "LAKEBROKER_BODY_READ_TIMEOUT_S": "1"})
    url = proc.start()
    assert httpx.post(url + "/v1/topics", json={"name": "orders", "partitions": 1}).status_code == 201
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        yield host, int(port)
    finally:
        proc.stop()


def _answer_while_trickling(address: tuple[str, int], head: bytes, body_start: bytes) -> bytes:
    """Send a request head and part of its body, then one more body byte at a time (which must not
    extend the deadline), until the server answers and closes; b"<still open>" if it never does."""
    out = b""
    with socket.create_connection(address) as sock:
        sock.sendall(head + body_start)
        sock.settimeout(0.2)
        for _ in range(300):  # a guard against a server that never answers, not a timing bound
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if not out:
                    with contextlib.suppress(OSError):
                        sock.sendall(b" ")
                continue
            except ConnectionResetError:
                return out + b"<reset>"
            if not chunk:
                return out  # closed by the server
            out += chunk
    return out + b"<still open>"


@pytest.mark.parametrize("path", ["/v1/topics/orders/messages", "/v1/topics/orders/batch", "/v1/subscriptions"])
def test_a_body_that_does_not_arrive_in_time_gets_408_and_close(quick_body_deadline: tuple[str, int],
                                                                 path: str) -> None:
    head = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            % path.encode())
    answer = _answer_while_trickling(quick_body_deadline, head, b'{"value": "')
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b'"code":"request_timeout"' in answer and b"body_read_timeout_s" in answer, answer[:300]
    assert b"connection: close" in answer.lower()
    assert not answer.endswith(b"<still open>")  # the slot is given back
    host, port = quick_body_deadline
    r = httpx.post(f"http://{host}:{port}/v1/topics/orders/messages", json={"value": 1})
    assert r.status_code == 200, r.text  # a body that arrives in time is unaffected


@pytest.mark.parametrize(("url", "why"), [("http://[::1/", "Invalid IPv6 URL"),
                                          ("http://" + "a" * 64 + ".example.com/", "longer than 63 characters")])
def test_malformed_webhook_urls_are_422_naming_the_problem(client: TestClient, orders: str, url: str,
                                                            why: str) -> None:
    assert_error(client.post("/v1/subscriptions", json={**HOOK, "url": url}), 422, why)
    assert client.get("/v1/subscriptions").json() == []
    assert client.post("/v1/subscriptions", json=HOOK).status_code == 201
    assert_error(client.patch("/v1/subscriptions/hooks", json={"url": url}), 422, why)
    assert client.get("/v1/subscriptions/hooks").json()["url"] == HOOK["url"]
