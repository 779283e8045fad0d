"""An endpoint that fails for a while, end to end: a real app (ingest + in-process delivery) and a real
receiver on loopback. Its circuit opens after a run of failures: sends pause, no message is retried
away into the dead letters, a probe goes after the cool-down, and once the endpoint answers again
every message is delivered. The state shows in the subscription's status and in /metrics."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from standardwebhooks import Webhook

from lakebroker.server import build_app
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.subscriptions import SubscriptionStore, new_secret
from tests.receivers import Receiver
from tests.waiting import eventually


@dataclass
class Operated:
    client: TestClient
    operators: Receiver  # the operational webhooks' receiver
    secret: str

    def events(self, n: int) -> list[dict[str, Any]]:
        """The first `n` operational events, each verified against its signature."""
        self.operators.wait_for(lambda: len(self.operators.received) >= n)
        hook = Webhook(self.secret)
        return [hook.verify(r.body, r.headers) for r in self.operators.received]  # raises on a bad signature


@pytest.fixture
def operated(settings: Settings) -> Iterator[Operated]:
    operators, secret = Receiver(), new_secret()
    configured = settings.model_copy(update={"operational_webhook_url": operators.url,
                                             "operational_webhook_secret": SecretStr(secret)})
    try:
        with TestClient(build_app(configured)) as client:
            assert client.post("/v1/topics", json={"name": "orders", "partitions": 3}).status_code == 201
            yield Operated(client, operators, secret)
    finally:
        operators.close()


def _circuit_open(client: TestClient) -> float:
    found = re.search(r'^lakebroker_delivery_circuit_open\{subscription="hooks"\} (\S+)$',
                      client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else -1.0


def test_a_failing_endpoint_gets_its_circuit_opened_and_loses_no_message(operated: Operated,
                                                                         receiver: Receiver) -> None:
    client = operated.client
    down = threading.Event()
    down.set()

    def behaviour(n: int, body: Any) -> tuple[int, dict[str, str], float]:
        return (503, {}, 0.0) if down.is_set() else (200, {}, 0.0)

    receiver.behaviour = behaviour
    body = {"name": "hooks", "topic": "orders", "url": receiver.url, "start": "earliest", "max_attempts": 8,
            "retry_schedule_s": [0.05], "timeout_s": 2, "max_in_flight": 4, "breaker_failures": 5,
            "breaker_cooldown_s": 1}
    created = client.post("/v1/subscriptions", json=body)
    assert created.status_code == 201, created.text
    assert (created.json()["breaker_failures"], created.json()["breaker_cooldown_ms"]) == (5, 1000)
    r = client.post("/v1/topics/orders/batch?ack=table",
                    json={"messages": [{"value": {"n": i}, "partition": i % 3} for i in range(30)]})
    assert r.status_code == 200

    def circuit_open() -> dict[str, Any] | None:
        status = client.get("/v1/subscriptions/hooks").json()
        return status if any(p["state"] == "circuit_open" for p in status["partitions"]) else None

    eventually(circuit_open, 20, what="a partition reporting the circuit open")
    assert eventually(lambda: _circuit_open(client) == 1, 10, what="the circuit-open gauge at 1")
    health = eventually(lambda: (h := client.get("/v1/subscriptions/hooks").json()["health"])["since"] and h, 10,
                        what="the health's failing-since recorded by the worker")
    assert health["state"] == "open" and "503" in health["last_error"]
    # Cool-downs of 1 s, then 2 s after a failed probe: without the breaker, 30 messages at 8
    # attempts each, 50 ms apart, would all be dead letters by now. (A message's attempts before the
    # circuit opens count: one with max_attempts below breaker_failures can still be dead-lettered.)
    threading.Event().wait(3.5)
    sent_while_down = len(receiver.received)
    assert sent_while_down <= 5 + 4 + 3, receiver.answers  # the run, what was in flight, the probes
    assert client.get("/v1/subscriptions/hooks/dead-letters").json()["dead_letters"] == []

    down.clear()
    receiver.wait_for(lambda: len(receiver.messages()) >= 30, timeout=30)
    assert sorted(m["value"]["n"] for m in receiver.messages()) == list(range(30))
    assert client.get("/v1/subscriptions/hooks/dead-letters").json()["dead_letters"] == []
    assert eventually(lambda: _circuit_open(client) == 0, 10, what="the circuit-open gauge back at 0")
    status = eventually(lambda: (s := client.get("/v1/subscriptions/hooks").json())
                        and all(p["lag"] == 0 for p in s["partitions"]) and s, 20, what="no lag")
    assert {p["state"] for p in status["partitions"]} == {"healthy"}
    healed = eventually(lambda: (h := client.get("/v1/subscriptions/hooks").json()["health"])["state"] == "healthy"
                        and h, 10, what="healthy again, failing-since cleared")
    assert healed == {"state": "healthy", "since": None, "last_error": None}
    assert client.get("/v1/subscriptions/hooks").json()["failing_since"] is None
    [recovered] = operated.events(1)
    assert recovered["type"] == "subscription.recovered"
    assert recovered["data"]["subscription"] == "hooks" and recovered["data"]["failing_since"] == health["since"]


def test_an_endpoint_failing_past_disable_after_disables_the_subscription_until_resumed(
        operated: Operated, receiver: Receiver) -> None:
    """The operators hear of it: subscription.disabled, signed."""
    _disabled_then_resumed(operated.client, receiver)
    [disabled] = operated.events(1)
    assert disabled["type"] == "subscription.disabled"
    assert disabled["data"]["subscription"] == "hooks" and disabled["data"]["topic"] == "orders"
    assert disabled["data"]["reason"].startswith("no delivery succeeded for 2 s")
    assert disabled["data"]["failing_since"] is not None
    assert operated.operators.received[0].headers["webhook-id"].startswith("op_disabled_hooks_")


def _disabled_then_resumed(client: TestClient, receiver: Receiver) -> None:
    down = threading.Event()
    down.set()
    receiver.behaviour = lambda n, body: (503, {}, 0.0) if down.is_set() else (200, {}, 0.0)
    body = {"name": "hooks", "topic": "orders", "url": receiver.url, "start": "earliest", "max_attempts": 8,
            "retry_schedule_s": [0.05], "max_in_flight": 2, "breaker_failures": 3, "breaker_cooldown_s": 60,
            "disable_after_s": 2}
    assert client.post("/v1/subscriptions", json=body).status_code == 201
    assert client.post("/v1/topics/orders/batch?ack=table",
                       json={"messages": [{"value": {"n": i}} for i in range(10)]}).status_code == 200
    disabled = eventually(lambda: (s := client.get("/v1/subscriptions/hooks").json())["disabled_reason"] and s, 30,
                          what="the subscription disabled")
    assert disabled["disabled_reason"].startswith("no delivery succeeded for 2 s (failing since ")
    assert disabled["health"] == {"state": "disabled", "since": disabled["failing_since"],
                                  "last_error": disabled["disabled_reason"]}
    assert disabled["endpoint_state"] == "disabled"
    assert client.get("/v1/subscriptions/hooks/dead-letters").json()["dead_letters"] == []

    # Resumed, the endpoint starts with a closed circuit: the operator says it is mended, so the
    # next send goes now, not after the 60 s cool-down of the circuit that was open when it was disabled.
    down.clear()
    resumed = client.post("/v1/subscriptions/hooks/resume").json()
    assert resumed["disabled_reason"] is None and resumed["failing_since"] is None
    receiver.wait_for(lambda: len(receiver.messages()) >= 10, timeout=30)
    assert sorted(m["value"]["n"] for m in receiver.messages()) == list(range(10))
    assert client.get("/v1/subscriptions/hooks").json()["disabled_reason"] is None


def test_an_endpoint_failing_every_other_request_opens_its_circuit_by_the_failure_ratio(
        operated: Operated, receiver: Receiver) -> None:
    """No run ever reaches breaker_failures, but half the attempts of the window fail."""
    client = operated.client
    flaky = threading.Event()
    flaky.set()
    receiver.behaviour = lambda n, body: (503 if flaky.is_set() and n % 2 else 200, {}, 0.0)
    body = {"name": "hooks", "topic": "orders", "url": receiver.url, "start": "earliest", "max_attempts": 20,
            "retry_schedule_s": [0.05], "max_in_flight": 1, "ordering": "partition", "breaker_failures": 20,
            "breaker_cooldown_s": 1, "breaker_failure_ratio": 0.4, "breaker_window_s": 60,
            "breaker_min_requests": 10}
    created = client.post("/v1/subscriptions", json=body)
    assert created.status_code == 201, created.text
    assert (created.json()["breaker_failure_ratio"], created.json()["breaker_window_ms"],
            created.json()["breaker_min_requests"]) == (0.4, 60_000, 10)
    assert client.post("/v1/topics/orders/batch?ack=table",
                       json={"messages": [{"value": {"n": i}, "partition": 0} for i in range(40)]}).status_code == 200
    eventually(lambda: _circuit_open(client) == 1, 20, what="the circuit opened by the share of failures")
    assert max(len(list(g)) for _, g in itertools.groupby(receiver.answers)) < 20  # never a run of 20
    flaky.clear()
    receiver.wait_for(lambda: len({m["value"]["n"] for m in receiver.messages()}) == 40, timeout=30)
    assert client.get("/v1/subscriptions/hooks/dead-letters").json()["dead_letters"] == []
    eventually(lambda: _circuit_open(client) == 0, 10, what="the circuit closed again")


def test_breaker_settings_are_checked(client: TestClient, orders: str, receiver: Receiver) -> None:
    base = {"name": "hooks", "topic": "orders", "url": receiver.url}
    for bad in ({"breaker_failures": -1}, {"breaker_failures": 10_001}, {"breaker_cooldown_s": 0.5},
                {"breaker_cooldown_s": 3601}, {"disable_after_s": -1}, {"disable_after_s": 365 * 86_400 + 1},
                {"breaker_failure_ratio": 0}, {"breaker_failure_ratio": 1.5}, {"breaker_window_s": 0.5},
                {"breaker_window_s": 3601}, {"breaker_min_requests": 0}, {"breaker_min_requests": 100_001}):
        assert client.post("/v1/subscriptions", json={**base, **bad}).status_code == 422, bad
    created = client.post("/v1/subscriptions", json=base).json()
    assert (created["breaker_failures"], created["breaker_cooldown_ms"], created["disable_after_ms"]) == (
        20, 30_000, 5 * 86_400_000)
    patched = client.patch("/v1/subscriptions/hooks", json={"breaker_failures": 0, "breaker_cooldown_s": 5})
    assert patched.status_code == 200
    assert (patched.json()["breaker_failures"], patched.json()["breaker_cooldown_ms"]) == (0, 5000)
    assert created["breaker_failure_ratio"] is None
    assert (created["breaker_window_ms"], created["breaker_min_requests"]) == (60_000, 20)
    patched = client.patch("/v1/subscriptions/hooks", json={"breaker_failure_ratio": 0.5, "breaker_window_s": 30,
                                                           "breaker_min_requests": 50}).json()
    assert (patched["breaker_failure_ratio"], patched["breaker_window_ms"], patched["breaker_min_requests"]) == (
        0.5, 30_000, 50)
    assert client.patch("/v1/subscriptions/hooks", json={"breaker_failure_ratio": None}).json()[
        "breaker_failure_ratio"] is None


def test_the_operational_webhook_needs_its_signing_secret(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9/ops"
    with pytest.raises(ValueError, match="operational_webhook_url and operational_webhook_secret come together"):
        Settings(data_dir=tmp_path, operational_webhook_url=url)
    with pytest.raises(ValueError, match="operational_webhook_secret: secret must be a Standard Webhooks secret"):
        Settings(data_dir=tmp_path, operational_webhook_url=url, operational_webhook_secret=SecretStr("hunter2"))
    assert Settings(data_dir=tmp_path, operational_webhook_url=url,
                    operational_webhook_secret=SecretStr(new_secret())).operational_webhook_url == url


def test_a_failing_since_left_by_a_gone_worker_clears_once_the_endpoint_answers(
        operated: Operated, receiver: Receiver, settings: Settings) -> None:
    """A worker whose circuit opened set `failing_since`, then died: the worker delivering now has a
    closed circuit that never changes, yet its endpoint's answers clear `failing_since` (health back
    to healthy, subscription.recovered sent), so no count towards disable_after goes on."""
    client = operated.client
    body = {"name": "hooks", "topic": "orders", "url": receiver.url, "start": "earliest"}
    assert client.post("/v1/subscriptions", json=body).status_code == 201
    SubscriptionStore(Layout(settings.data_dir)).update("hooks", failing_since=datetime.now(UTC) - timedelta(minutes=5))
    left = client.get("/v1/subscriptions/hooks").json()
    assert left["health"]["state"] == "failing" and left["failing_since"] is not None

    assert client.post("/v1/topics/orders/batch?ack=table",
                       json={"messages": [{"value": {"n": i}} for i in range(5)]}).status_code == 200
    receiver.wait_for(lambda: len(receiver.messages()) >= 5, timeout=30)
    healed = eventually(lambda: (s := client.get("/v1/subscriptions/hooks").json())["failing_since"] is None and s,
                        20, what="failing_since cleared by the endpoint's answers")
    assert healed["health"] == {"state": "healthy", "since": None, "last_error": None}
    [recovered] = operated.events(1)
    assert recovered["type"] == "subscription.recovered"
    assert recovered["data"]["failing_since"] == left["failing_since"]
