"""A receiver that flaps, throttles, is slow and times out: every message is delivered or
dead-lettered, none is lost, and the group's offset still reaches the end."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.receivers import Receiver
from tests.waiting import eventually

pytestmark = pytest.mark.fault

MESSAGES = 150


def test_flapping_slow_and_timing_out_receiver_loses_nothing(client: TestClient, orders: str) -> None:
    rng = random.Random(3)
    lock = threading.Lock()

    def behaviour(n: int, body: Any) -> tuple[int, dict[str, str], float]:
        with lock:
            roll = rng.random()
        if (n // 40) % 2 == 1 and roll < 0.7:
            return 503, {}, 0.0  # flapping: every other stretch of 40 requests mostly fails
        if roll < 0.25:
            return 500, {}, 0.0
        if roll < 0.30:
            return 429, {"Retry-After": "1"}, 0.0
        if roll < 0.35:
            return 200, {}, 1.5  # past the 0.5 s timeout: counts as a failure, then redelivered
        if roll < 0.45:
            return 200, {}, 0.1  # slow but in time
        return 200, {}, 0.0

    receiver = Receiver(behaviour=behaviour)
    try:
        r = client.post("/v1/subscriptions", json={
            "name": "hooks", "topic": "orders", "url": receiver.url, "start": "earliest", "ordering": "none",
            "max_in_flight": 16, "max_attempts": 4, "retry_schedule_s": [0.05, 0.1, 0.2], "timeout_s": 0.5})
        assert r.status_code == 201, r.text
        client.post("/v1/topics/orders/batch?ack=table", json={"messages": [{"value": i} for i in range(MESSAGES)]})
        def settled() -> dict[str, Any] | None:
            status: dict[str, Any] = client.get("/v1/subscriptions/hooks").json()
            return status if sum(p["committed_offset"] for p in status["partitions"]) == MESSAGES else None

        status = eventually(settled, 120, what=f"{MESSAGES} messages committed", interval=0.2)
        delivered = {(m["partition"], m["offset"]) for m in receiver.messages()}
        letters = client.get("/v1/subscriptions/hooks/dead-letters?limit=1000").json()["dead_letters"]
        dead = {(d["partition"], d["offset"]) for d in letters}
        expected = {(p["partition"], o) for p in status["partitions"] for o in range(p["high_watermark"])}
        assert len(expected) == MESSAGES
        assert expected - delivered - dead == set(), "messages neither delivered nor dead-lettered"
        assert len(dead) > 0 and len(delivered) > MESSAGES // 2  # the faults were real, and so was delivery
        assert {429, 500, 503} <= set(receiver.answers)
    finally:
        receiver.close()
