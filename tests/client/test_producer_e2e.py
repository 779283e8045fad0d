"""Producer against a real `lakebroker serve`: a SIGKILL mid-run, back-pressure, and lost answers.

Every check reads the topic back, so "nothing lost, nothing written twice" is checked against
the Delta table, not against the producer's own view.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx

from lakebroker_client import Batching, Consumer, Message, Producer, Retry, SendResult
from tests.client.conftest import FAST, Broker
from tests.servers import ServerProcess, free_port


def read_messages(url: str, topic: str, token: str | None, count: int) -> list[Message]:
    messages: list[Message] = []
    deadline = time.monotonic() + 60
    with Consumer(url, topic, token=token, max_poll_records=5000) as consumer:
        while len(messages) < count and time.monotonic() < deadline:
            messages.extend(consumer.poll(timeout_s=1))
        messages.extend(consumer.poll(timeout_s=0.5))  # anything beyond count would show here
    return messages


def read_all(url: str, topic: str, token: str | None, count: int) -> list[Any]:
    return [m.value for m in read_messages(url, topic, token, count)]


def test_a_broker_killed_mid_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", env=FAST, port=free_port())
    url = server.start()
    httpx.post(url + "/v1/topics", json={"name": "orders", "partitions": 3}).raise_for_status()
    total = 3000
    futures: list[Future[SendResult]] = []
    producer = Producer(url, batching=Batching(linger_ms=5, max_messages=50), retry=Retry(timeout_s=120))

    def send_steadily() -> None:
        for i in range(total):
            futures.append(producer.send("orders", i, key=f"customer-{i % 97}"))
            if i % 20 == 0:
                time.sleep(0.01)

    sender = threading.Thread(target=send_steadily)
    try:
        sender.start()
        while sum(f.done() for f in list(futures)) < 300:
            time.sleep(0.01)
        server.kill()  # SIGKILL while batches are in flight
        time.sleep(1.0)
        server.start()  # same port, so the producer's retries reach it
        sender.join()
        assert producer.flush(timeout_s=120) == 0
        results = [f.result() for f in futures]
        stats = producer.stats()
        producer.close()

        assert stats.retries > 0 and stats.failed == 0
        assert all(r.offset is not None for r in results)
        assert len({(r.partition, r.offset) for r in results}) == total, "no two messages share an offset"
        values = read_all(url, "orders", None, total)
        assert sorted(values) == list(range(total)), "every message exactly once in the table"
    finally:
        producer.close(timeout_s=1)
        server.stop()


def test_back_pressure_429_is_retried_after_retry_after(tmp_path: Path) -> None:
    # No wait for room on the server: every produce over the backlog is answered 429 at once.
    env = {**FAST, "LAKEBROKER_MAX_BACKLOG_BYTES": "1", "LAKEBROKER_FLUSH_INTERVAL_MS": "300",
           "LAKEBROKER_BACKPRESSURE_WAIT_MS": "0"}
    server = ServerProcess(tmp_path / "data", env=env)
    url = server.start()
    try:
        httpx.post(url + "/v1/topics", json={"name": "slow", "partitions": 1}).raise_for_status()
        started = time.monotonic()
        with Producer(url, batching=Batching(linger_ms=0)) as p:
            results = [p.send("slow", i).result(timeout=60) for i in range(3)]
            stats = p.stats()
        assert [r.offset for r in results] == [0, 1, 2]
        assert stats.throttled >= 1 and stats.failed == 0
        assert time.monotonic() - started >= 0.9, "a throttled send waited for Retry-After (1 s)"
        metrics = httpx.get(url + "/metrics").text
        rejected = re.search(r'lakebroker_produce_rejected_total\{reason="backpressure"\} (\d+)', metrics)
        assert rejected is not None and float(rejected.group(1)) >= stats.throttled
        assert read_all(url, "slow", None, 3) == [0, 1, 2]
    finally:
        server.stop()


class LosesFirstAnswer(httpx.HTTPTransport):
    """Forwards to the broker, then drops the first /batch answer: the request was written, the
    client never heard back, as when a connection resets after the broker answered."""

    def __init__(self) -> None:
        super().__init__()
        self.lost: dict[str, Any] | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if self.lost is None and request.url.path.endswith("/batch"):
            response.read()
            self.lost = httpx.Response(response.status_code, content=response.content).json()
            response.close()
            raise httpx.ReadError("connection reset after the broker answered")
        return response


def test_a_retry_after_a_lost_answer_is_answered_as_a_duplicate(broker: Broker) -> None:
    topic = broker.create_topic("p-lost", partitions=3)
    transport = LosesFirstAnswer()
    with Producer(broker.url, broker.token, transport=transport, batching=Batching(linger_ms=50),
                  retry=Retry(initial_backoff_s=0.01)) as p:
        futures = [p.send(topic, f"m{i}", key=f"k{i}") for i in range(3)]
        results = [f.result(timeout=30) for f in futures]
        assert p.stats().retries == 1
    assert transport.lost is not None
    original = [(r["partition"], r["offset"]) for r in transport.lost["results"]]
    assert [(r.partition, r.offset) for r in results] == original, "the retry got the original offsets"
    stored = {(m.partition, m.offset): m.timestamp for m in read_messages(broker.url, topic, broker.token, 3)}
    assert [r.timestamp for r in results] == [stored[(r.partition, r.offset)] for r in results], \
        "each SendResult carries the timestamp stored with its message"
    assert all(r.duplicate for r in results)
    assert sorted(read_all(broker.url, topic, broker.token, 3)) == ["m0", "m1", "m2"]

    # An id of the caller's (an order number) deduplicates across producers too.
    with Producer(broker.url, broker.token) as a, Producer(broker.url, broker.token) as b:
        first = a.send(topic, "order", id="order-1001").result(timeout=30)
        second = b.send(topic, "order again", id="order-1001").result(timeout=30)
    assert not first.duplicate and first.timestamp is not None
    assert second == SendResult(topic, first.partition, first.offset, first.timestamp, True)
