"""Producer behaviour against a swapped transport: batching, retries, splitting, ids, closing."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest

from lakebroker_client import (
    Batching,
    BrokerUnavailable,
    BufferFull,
    ClientClosed,
    Producer,
    RequestRefused,
    Retry,
    SendResult,
)

STAMP = "2026-01-02T03:04:05.000006+00:00"
FAST_RETRY = Retry(timeout_s=10, initial_backoff_s=0.01, max_backoff_s=0.05)
Handler = Callable[[httpx.Request, list[dict[str, Any]]], httpx.Response]


class Recorder:
    """A MockTransport that records every request's messages and answers with `handler`."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.requests: list[tuple[float, httpx.Request, list[dict[str, Any]]]] = []
        self.handler = handler or (lambda req, msgs: ok(msgs))
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        messages = orjson.loads(request.content)["messages"]
        with self.lock:
            self.requests.append((time.monotonic(), request, messages))
        return self.handler(request, messages)

    @property
    def sizes(self) -> list[int]:
        return [len(m) for _, _, m in self.requests]


def ok(messages: list[dict[str, Any]], duplicate: bool = False) -> httpx.Response:
    return httpx.Response(200, json={"results": [{"partition": 0, "offset": i, "duplicate": duplicate,
                                                  "timestamp": STAMP} for i in range(len(messages))]})


def producer(rec: Recorder, **kwargs: Any) -> Producer:
    kwargs.setdefault("retry", FAST_RETRY)
    return Producer("http://broker.test", transport=httpx.MockTransport(rec), **kwargs)


def test_sends_within_the_linger_share_one_request_and_results_keep_order() -> None:
    rec = Recorder()
    with producer(rec, batching=Batching(linger_ms=100)) as p:
        futures = [p.send("orders", {"n": i}) for i in range(10)]
        results = [f.result(timeout=5) for f in futures]
    assert rec.sizes == [10]
    _, request, messages = rec.requests[0]
    assert request.url.path == "/v1/topics/orders/batch" and request.url.params["ack"] == "wal"
    assert [m["value"] for m in messages] == [{"n": i} for i in range(10)]
    assert len({m["id"] for m in messages}) == 10, "every message gets its own id"
    when = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert results == [SendResult("orders", 0, i, when, False) for i in range(10)]


def test_full_batches_go_at_once_and_flush_sends_the_rest() -> None:
    rec = Recorder()
    p = producer(rec, batching=Batching(linger_ms=60_000, max_messages=4))
    futures = [p.send("t", i) for i in range(10)]
    for f in futures[:8]:
        f.result(timeout=5)  # two full batches, without waiting for the linger
    assert not futures[9].done()
    assert p.flush(timeout_s=5) == 0
    assert all(f.done() for f in futures)
    assert rec.sizes == [4, 4, 2]
    p.close()


def test_topics_and_ack_modes_are_batched_apart() -> None:
    rec = Recorder()
    with producer(rec, batching=Batching(linger_ms=50)) as p:
        p.send("a", 1)
        p.send("b", 2)
        p.send("a", 3, ack="table")
        p.flush()
    seen = sorted((r.url.path, r.url.params["ack"], len(m)) for _, r, m in rec.requests)
    assert seen == [("/v1/topics/a/batch", "table", 1), ("/v1/topics/a/batch", "wal", 1),
                    ("/v1/topics/b/batch", "wal", 1)]


def test_connection_errors_and_5xx_are_retried_with_the_same_ids() -> None:
    def flaky(request: httpx.Request, messages: list[dict[str, Any]]) -> httpx.Response:
        n = len(rec.requests)
        if n == 1:
            raise httpx.ConnectError("connection refused")
        if n == 2:
            return httpx.Response(503, json={"error": {"code": "unavailable", "message": "restarting"}})
        return ok(messages)

    rec = Recorder(flaky)
    with producer(rec, batching=Batching(linger_ms=20)) as p:
        futures = [p.send("t", i) for i in range(3)]
        assert [f.result(timeout=5).offset for f in futures] == [0, 1, 2]
        stats = p.stats()
    bodies = [m for _, _, m in rec.requests]
    assert len(bodies) == 3 and bodies[0] == bodies[1] == bodies[2], "a retry re-sends the same messages and ids"
    assert stats.retries == 2 and stats.messages == 3 and stats.failed == 0


def test_429_waits_for_retry_after() -> None:
    def throttled(request: httpx.Request, messages: list[dict[str, Any]]) -> httpx.Response:
        if len(rec.requests) == 1:
            return httpx.Response(429, headers={"retry-after": "1"},
                                  json={"error": {"code": "backpressure", "message": "backlog"}})
        return ok(messages)

    rec = Recorder(throttled)
    with producer(rec, batching=Batching(linger_ms=0)) as p:
        p.send("t", "x").result(timeout=5)
        assert p.stats().throttled == 1
    (first, _, _), (second, _, _) = rec.requests
    assert second - first >= 0.95, "the retry honoured Retry-After: 1"


def test_a_refused_batch_is_resent_one_by_one_so_only_the_bad_message_fails() -> None:
    def strict(request: httpx.Request, messages: list[dict[str, Any]]) -> httpx.Response:
        if any(m["value"] == "bad" for m in messages):
            return httpx.Response(400, json={"error": {"code": "invalid_request", "message": "partition 9 is "
                                                       "out of range"}})
        return ok(messages)

    rec = Recorder(strict)
    with producer(rec, batching=Batching(linger_ms=50)) as p:
        futures = [p.send("t", v) for v in ("a", "bad", "c")]
        p.flush()
    assert futures[0].result().offset == 0 and futures[2].result().offset == 0
    error = futures[1].exception()
    assert isinstance(error, RequestRefused) and error.status == 400 and error.code == "invalid_request"
    assert "out of range" in error.message
    assert rec.sizes == [3, 1, 1, 1], "split in order after the batch was refused"


def test_a_refusal_for_the_whole_request_fails_every_message_without_retrying() -> None:
    rec = Recorder(lambda req, msgs: httpx.Response(404, json={"error": {"code": "not_found",
                                                                         "message": "topic 't' does not exist"}}))
    with producer(rec, batching=Batching(linger_ms=20)) as p:
        futures = [p.send("t", i) for i in range(3)]
        p.flush()
    assert rec.sizes == [3]
    assert all(isinstance(f.exception(), RequestRefused) and f.exception().status == 404  # type: ignore[union-attr]
               for f in futures)


def test_retries_give_up_after_the_retry_timeout() -> None:
    rec = Recorder(lambda req, msgs: httpx.Response(503, text="down"))
    with producer(rec, retry=Retry(timeout_s=0.3, initial_backoff_s=0.02, max_backoff_s=0.05)) as p:
        error = p.send("t", 1).exception(timeout=5)
    assert isinstance(error, BrokerUnavailable) and error.last_status == 503
    assert len(rec.requests) >= 3


def test_producer_id_and_sequence_replace_random_ids_and_an_explicit_id_wins() -> None:
    rec = Recorder()
    with producer(rec, producer_id="billing-7", first_sequence=5, batching=Batching(linger_ms=20)) as p:
        p.send("t", 1)
        p.send("t", 2, id="order-42")
        p.send("t", 3)
        p.flush()
    messages = rec.requests[0][2]
    assert messages[0]["producer_id"] == "billing-7" and messages[0]["sequence"] == 5
    assert messages[1]["id"] == "order-42" and "producer_id" not in messages[1]
    assert messages[2]["sequence"] == 6


def test_value_kinds_and_message_fields() -> None:
    rec = Recorder()
    with producer(rec, batching=Batching(linger_ms=20)) as p:
        p.send("t", b"\x00\xff", key="k", headers={"h": "v"}, partition=2)
        p.send("t", None)
        with pytest.raises(TypeError):
            p.send("t", 1, headers={"h": 1})  # type: ignore[dict-item]
        with pytest.raises(TypeError):
            p.send("t", object())
        with pytest.raises(ValueError):
            p.send("t", 1, ack="sometimes")  # type: ignore[arg-type]
        p.flush()
    first, second = rec.requests[0][2]
    assert first["value_b64"] == "AP8=" and "value" not in first
    assert (first["key"], first["headers"], first["partition"]) == ("k", {"h": "v"}, 2)
    assert second["value"] is None, "None is sent as a tombstone"


def test_keys_and_values_as_bytes_or_str_with_serializers() -> None:
    rec = Recorder()
    with producer(rec, batching=Batching(linger_ms=20)) as p:
        p.send("t", "text", key=b"user-7", headers=[("trace", b"abc"), ("kind", "x")])
        with pytest.raises(ValueError, match="UTF-8"):
            p.send("t", 1, key=b"\xff")
        with pytest.raises(TypeError):
            p.send("t", 1, key=7)
        with pytest.raises(ValueError, match="twice"):
            p.send("t", 1, headers=[("h", "a"), ("h", "b")])
        p.flush()
    with producer(rec, batching=Batching(linger_ms=20), key_serializer=lambda k: str(k).encode(),
                  value_serializer=lambda v: json.dumps(v).encode()) as p:
        p.send("t", {"a": 1}, key=42)
        p.send("t", None, key=42)  # a tombstone stays a tombstone: the serializer is not called
        p.flush()
    with producer(rec, value_serializer=lambda v: v) as p, pytest.raises(TypeError, match="bytes or str"):
        p.send("t", {"a": 1})
    (first,), (second, third) = (m for _, _, m in rec.requests)
    assert (first["key"], first["value"], first["headers"]) == ("user-7", "text", {"trace": "abc", "kind": "x"})
    assert second["key"] == "42" and json.loads(base64.b64decode(second["value_b64"])) == {"a": 1}
    assert third["key"] == "42" and third["value"] is None and "value_b64" not in third


def test_close_sends_what_is_queued_and_later_sends_are_refused() -> None:
    rec = Recorder()
    p = producer(rec, batching=Batching(linger_ms=60_000))
    future = p.send("t", 1)
    p.close()
    assert future.result(timeout=0).offset == 0
    with pytest.raises(ClientClosed):
        p.send("t", 2)


def test_close_with_a_timeout_fails_what_cannot_be_sent() -> None:
    def down(request: httpx.Request, messages: list[dict[str, Any]]) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    p = producer(Recorder(down), retry=Retry(timeout_s=60, initial_backoff_s=0.05, max_backoff_s=0.1))
    future = p.send("t", 1)
    started = time.monotonic()
    p.close(timeout_s=0.3)
    assert time.monotonic() - started < 5
    assert isinstance(future.exception(timeout=0), ClientClosed)


def test_a_full_buffer_blocks_send_then_raises_buffer_full() -> None:
    release = threading.Event()

    def slow(request: httpx.Request, messages: list[dict[str, Any]]) -> httpx.Response:
        release.wait(10)
        return ok(messages)

    p = producer(Recorder(slow), batching=Batching(linger_ms=0, max_messages=1, buffer_messages=1, block_s=0.2))
    first = p.send("t", 1)
    with pytest.raises(BufferFull):
        p.send("t", 2)
    release.set()
    assert first.result(timeout=5).offset == 0
    p.send("t", 3).result(timeout=5)  # room again
    p.close()
