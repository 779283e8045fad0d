"""Replays by SQL predicate, end to end: a real app (ingest + in-process delivery) and a real
receiver on loopback. A replay sends again what its predicate (on the key, headers, value fields,
time) matches, in offset order per partition, beside live traffic that it never holds back; its
progress is in the API and /metrics; it can be cancelled midway; bad predicates get 422."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from tests.delivery_worker.orders import eu_over_100, order_messages
from tests.receivers import Receiver
from tests.waiting import eventually

EU_OVER_100 = "key LIKE 'eu-%' AND headers['region'] = 'eu' AND (value->>'amount')::DOUBLE > 100"


def _produce(client: TestClient, messages: list[dict[str, Any]]) -> None:
    r = client.post("/v1/topics/orders/batch?ack=table", json={"messages": messages})
    assert r.status_code == 200, r.text


def _subscribe(client: TestClient, receiver: Receiver, **options: Any) -> None:
    body = {"name": "hooks", "topic": "orders", "url": receiver.url, "start": "earliest", "ordering": "partition",
            **options}
    r = client.post("/v1/subscriptions", json=body)
    assert r.status_code == 201, r.text


def _finished(client: TestClient, replay_id: str, timeout: float = 60) -> dict[str, Any]:
    return eventually(lambda: (r := client.get(f"/v1/subscriptions/hooks/replays/{replay_id}").json())
                      ["state"] != "running" and r, timeout, what=f"replay {replay_id} finished")


def _metric(client: TestClient, outcome: str) -> float:
    series = f'lakebroker_delivery_replayed_messages_total{{outcome="{outcome}",subscription="hooks"}}'
    found = re.search("^" + re.escape(series) + r" (\S+)$", client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_replay_sends_what_its_predicate_matches_in_offset_order_beside_live_delivery(
        client: TestClient, orders: str, receiver: Receiver) -> None:
    _subscribe(client, receiver)
    first = order_messages(0, 90)
    _produce(client, first)
    receiver.wait_for(lambda: len(receiver.messages()) >= 90)
    live_before = len(receiver.messages())

    created = client.post("/v1/subscriptions/hooks/replays", json={"where": EU_OVER_100})
    assert created.status_code == 201, created.text
    replay = created.json()
    assert replay["id"].startswith("rpl_") and replay["where"] == EU_OVER_100
    assert replay["to_scan"] == 90 and replay["state"] in ("running", "done")
    _produce(client, order_messages(90, 30))  # live traffic beside it, past the replay's end
    done = _finished(client, replay["id"])

    expected = {m["value"]["n"] for m in first if eu_over_100(m)}
    assert len(expected) == 7
    assert done["state"] == "done" and done["error"] is None
    assert (done["matched"], done["delivered"], done["failed"]) == (len(expected), len(expected), 0)
    assert done["scanned"] == done["to_scan"] == 90
    assert all(p["state"] == "done" and p["next_offset"] == p["end_offset"] for p in done["partitions"])
    receiver.wait_for(lambda: len(receiver.messages()) >= live_before + 30 + len(expected))
    got = receiver.messages()
    times = Counter(m["value"]["n"] for m in got)
    assert {n for n, k in times.items() if k == 2} == expected  # the replayed ones, once more each
    assert set(times) == set(range(120)) and max(times.values()) == 2
    # In offset order per partition: the second sightings of each partition's replayed messages.
    seen: set[int] = set()
    again: dict[int, list[int]] = {}
    for m in got:
        if m["value"]["n"] in seen:
            again.setdefault(m["partition"], []).append(m["offset"])
        seen.add(m["value"]["n"])
    assert again and all(offsets == sorted(offsets) for offsets in again.values())
    assert _metric(client, "delivered") == len(expected) and _metric(client, "failed") == 0
    listed = client.get("/v1/subscriptions/hooks/replays").json()["replays"]
    assert [r["id"] for r in listed] == [replay["id"]]


def test_a_replay_by_time_and_partition_and_one_whose_cast_fails_on_a_value(
        client: TestClient, orders: str, receiver: Receiver) -> None:
    _subscribe(client, receiver)
    _produce(client, [{"partition": i % 3, "value": {"round": "a", "n": i}} for i in range(12)])
    since = datetime.now(UTC).isoformat()
    time.sleep(0.05)
    _produce(client, [{"partition": i % 3, "value": {"round": "b", "n": i}} for i in range(12)])
    until = datetime.now(UTC).isoformat()
    time.sleep(0.05)
    _produce(client, [{"partition": i % 3, "value": {"round": "c", "n": i}} for i in range(12)])
    receiver.wait_for(lambda: len(receiver.messages()) >= 36)

    created = client.post("/v1/subscriptions/hooks/replays", json={"since": since, "until": until, "partitions": [1]})
    assert created.status_code == 201, created.text
    done = _finished(client, created.json()["id"])
    assert (done["state"], done["matched"], done["delivered"]) == ("done", 4, 4)
    assert [p["partition"] for p in done["partitions"]] == [1]
    receiver.wait_for(lambda: len(receiver.messages()) >= 40)
    replayed = receiver.messages()[36:]
    assert [(m["partition"], m["value"]["round"]) for m in replayed] == [(1, "b")] * 4

    # An offset range (to_offset included) in one partition.
    ranged = _finished(client, client.post("/v1/subscriptions/hooks/replays", json={
        "from_offset": 1, "to_offset": 2, "partitions": [0]}).json()["id"])
    assert (ranged["matched"], ranged["delivered"], ranged["to_scan"]) == (2, 2, 2)
    receiver.wait_for(lambda: len(receiver.messages()) >= 42)
    assert [(m["partition"], m["offset"]) for m in receiver.messages()[40:]] == [(0, 1), (0, 2)]

    # A cast the table's types allow but one value refuses: the replay fails, saying why.
    _produce(client, [{"partition": 0, "value": {"amount": "n/a"}}])
    bad = client.post("/v1/subscriptions/hooks/replays", json={"where": "(value->>'amount')::INT > 5"})
    assert bad.status_code == 201, bad.text
    failed = _finished(client, bad.json()["id"])
    assert failed["state"] == "failed" and "Could not convert string 'n/a'" in failed["error"]


def test_a_replay_never_sends_what_the_subscriptions_filter_passes_over(
        client: TestClient, orders: str, receiver: Receiver) -> None:
    _subscribe(client, receiver, filter='hasPrefix(key, "eu-")')
    _produce(client, order_messages(0, 450))  # 75 eu- keys a partition: more than a chunk (replay.CHUNK_ROWS)
    receiver.wait_for(lambda: len(receiver.messages()) >= 225)
    asked = client.post("/v1/subscriptions/hooks/replays", json={"where": "(value->>'n')::INT % 2 = 0"})
    replay_id = asked.json()["id"]
    done = _finished(client, replay_id)
    assert (done["state"], done["matched"], done["delivered"], done["scanned"]) == ("done", 225, 225, 450)
    receiver.wait_for(lambda: len(receiver.messages()) >= 450)
    time.sleep(0.5)
    got = receiver.messages()
    assert len(got) == 450 and all(m["key"].startswith("eu-") for m in got)
    assert Counter(Counter(m["value"]["n"] for m in got).values()) == {2: 225}
    # A replay's webhook-ids are its own: a receiver that drops the ids it has seen takes it.
    ids = [r.headers["webhook-id"] for r in receiver.received]
    assert len(set(ids)) == 450 and sum(i.endswith("_" + replay_id) for i in ids) == 225


def test_a_replay_cancelled_midway_stops_sending(client: TestClient, orders: str, receiver: Receiver) -> None:
    slow = threading.Event()
    receiver.behaviour = lambda n, body: (200, {}, 0.15 if slow.is_set() else 0.0)
    _subscribe(client, receiver)
    _produce(client, order_messages(0, 150))
    receiver.wait_for(lambda: len(receiver.messages()) >= 150)
    slow.set()
    replay_id = client.post("/v1/subscriptions/hooks/replays", json={"where": "value.n::INT >= 0"}).json()["id"]
    receiver.wait_for(lambda: len(receiver.messages()) >= 155)
    cancelled = client.delete(f"/v1/subscriptions/hooks/replays/{replay_id}")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"

    def settled() -> int | None:
        """The count once it has not moved for two seconds (the worker looks every second)."""
        before = len(receiver.messages())
        time.sleep(2)
        return before if len(receiver.messages()) == before else None

    assert eventually(settled, 30, what="no more sends after the cancel") < 300
    final = client.get(f"/v1/subscriptions/hooks/replays/{replay_id}").json()
    assert final["state"] == "cancelled" and 0 < final["delivered"] < 150
    assert client.delete(f"/v1/subscriptions/hooks/replays/{replay_id}").json()["state"] == "cancelled"


def test_bad_replays_are_refused_with_the_reason(client: TestClient, orders: str, receiver: Receiver) -> None:
    _subscribe(client, receiver)
    _produce(client, order_messages(0, 3))
    for body, status, words in [
        ({"where": "key IN (SELECT key FROM messages)"}, 422, "subqueries are not allowed"),
        ({"where": "read_csv('/etc/passwd') IS NOT NULL"}, 422, "the function 'read_csv' is not allowed"),
        ({"where": "amount > 5"}, 422, "no column 'amount'"),
        ({"where": "key > 5"}, 422, "Cannot compare values of type VARCHAR"),
        ({"where": "key::nosuchtype = 'x'"}, 422, "nosuchtype"),
        ({"where": "key = 'a'; DELETE FROM messages"}, 422, "syntax error"),
        ({"where": "   "}, 422, "the predicate is empty"),
        ({"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"}, 400, "since must be before until"),
        ({"since": "yesterday"}, 400, "neither epoch milliseconds nor ISO 8601"),
        ({"from_offset": 9, "to_offset": 3}, 400, "from_offset must not be after to_offset"),
        ({"partitions": [3]}, 400, "partition 3"),
        ({"where": "key = 'a'", "limit": 5}, 422, "limit"),
    ]:
        r = client.post("/v1/subscriptions/hooks/replays", json=body)
        assert r.status_code == status and words in r.text, (body, r.status_code, r.text)
    assert client.post("/v1/subscriptions/nope/replays", json={}).status_code == 404
    assert client.get("/v1/subscriptions/hooks/replays/rpl_0000").status_code == 404
    assert client.delete("/v1/subscriptions/hooks/replays/rpl_0000").status_code == 404
    assert client.get("/v1/subscriptions/hooks/replays").json() == {"replays": []}


def test_a_replay_that_keeps_failing_fails_with_its_error(client: TestClient, orders: str, receiver: Receiver,
                                                          settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a predicate's error but a fault (here the topic's data files gone): retried at each
    check, and once it has failed for REPLAY_GIVE_UP_S without a success, the replay fails with
    the error, rather than stay running with none shown."""
    monkeypatch.setattr("lakebroker.delivery_worker.worker.REPLAY_GIVE_UP_S", 1.0)
    _subscribe(client, receiver)
    _produce(client, order_messages(0, 5))
    receiver.wait_for(lambda: len(receiver.messages()) >= 5)
    for data in Path(Layout(settings.data_dir).topic_table("orders")).rglob("*.parquet"):
        data.unlink()
    replay_id = client.post("/v1/subscriptions/hooks/replays", json={"where": "value.n::INT >= 0"}).json()["id"]
    failed = _finished(client, replay_id, timeout=30)
    assert failed["state"] == "failed" and failed["error"].startswith("failing for 1 s in partition ")
    assert failed["delivered"] == 0 and len(receiver.messages()) == 5
