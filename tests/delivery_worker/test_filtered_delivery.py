"""A subscription's filter, end to end: a real app (ingest + in-process delivery) pushing to a real
receiver on loopback delivers only what the filter matches, commits past the rest, counts them,
takes a new filter by PATCH from the next message, and refuses a filter that means nothing."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from tests.delivery_worker.orders import eu_over_100, order_messages
from tests.receivers import Receiver
from tests.waiting import eventually

EU_OVER_100 = 'hasPrefix(key, "eu-") AND headers.region = "eu" AND value.amount > 100'


def _produce(client: TestClient, messages: list[dict[str, Any]]) -> None:
    r = client.post("/v1/topics/orders/batch?ack=table", json={"messages": messages})
    assert r.status_code == 200, r.text


def _filtered_total(client: TestClient) -> float:
    text = client.get("/metrics").text
    found = re.search(r'^lakebroker_delivery_filtered_messages_total\{subscription="hooks"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _applied(client: TestClient) -> None:
    """Wait until the worker has seen a change just made: a tick begun after it has ended (the
    worker reads the subscriptions once per tick, and restarts the pipelines whose config changed)."""
    worker = client.app.state.live_status.worker  # type: ignore[attr-defined]  # conftest: delivery in process
    seen = worker.ticks
    eventually(lambda: worker.ticks >= seen + 2, 30, what="two ticks of the delivery worker")


def _caught_up(client: TestClient, committed: int) -> dict[str, Any]:
    return eventually(lambda: (s := client.get("/v1/subscriptions/hooks").json())
                      and sum(p["committed_offset"] for p in s["partitions"]) == committed and s, 30,
                      what=f"the group's positions past all {committed} messages")


def test_only_matching_messages_are_delivered_and_the_rest_committed_past(
        client: TestClient, orders: str, receiver: Receiver) -> None:
    body = {"name": "hooks", "topic": "orders", "url": receiver.url, "start": "earliest", "filter": EU_OVER_100}
    created = client.post("/v1/subscriptions", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["filter"] == EU_OVER_100
    first = order_messages(0, 120)
    _produce(client, first)
    wanted = sorted(m["value"]["n"] for m in first if eu_over_100(m))
    assert len(wanted) == 10
    status = _caught_up(client, 120)
    assert status["filter"] == EU_OVER_100 and all(p["lag"] == 0 for p in status["partitions"])
    receiver.wait_for(lambda: len(receiver.messages()) >= len(wanted))
    assert sorted(m["value"]["n"] for m in receiver.messages()) == wanted
    assert eventually(lambda: _filtered_total(client) == 110, 10, what="110 messages counted as filtered")

    # A new filter applies from the next message delivered; null removes it.
    patched = client.patch("/v1/subscriptions/hooks", json={"filter": 'headers.region = "us" OR NOT headers:region'})
    assert patched.status_code == 200, patched.text
    _applied(client)
    second = order_messages(120, 30)
    _produce(client, second)
    _caught_up(client, 150)
    more = sorted(m["value"]["n"] for m in second if m["headers"].get("region") != "eu")
    receiver.wait_for(lambda: len(receiver.messages()) >= len(wanted) + len(more))
    assert sorted(m["value"]["n"] for m in receiver.messages()) == sorted(wanted + more)

    assert client.patch("/v1/subscriptions/hooks", json={"filter": None}).json()["filter"] is None
    _applied(client)
    third = order_messages(150, 6)
    _produce(client, third)
    _caught_up(client, 156)
    receiver.wait_for(lambda: len(receiver.messages()) >= len(wanted) + len(more) + 6)
    assert {m["value"]["n"] for m in receiver.messages()} >= set(range(150, 156))


def test_a_filter_that_means_nothing_is_refused_with_where(client: TestClient, orders: str,
                                                          receiver: Receiver) -> None:
    body = {"name": "hooks", "topic": "orders", "url": receiver.url, "filter": "value.amount >"}
    r = client.post("/v1/subscriptions", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == {"code": "invalid_filter",
                                 "message": "filter: it ends where more was expected (column 15)"}
    assert client.get("/v1/subscriptions/hooks").status_code == 404  # nothing was made
    assert client.post("/v1/subscriptions", json={**body, "filter": 'key = "a"'}).status_code == 201
    r = client.patch("/v1/subscriptions/hooks", json={"filter": 'key < "b"'})
    assert r.status_code == 422 and r.json()["error"]["message"] == (
        "filter: < compares value fields only, not key (at column 1)")
    assert client.get("/v1/subscriptions/hooks").json()["filter"] == 'key = "a"'  # unchanged
