"""Delivery end to end: a real app (ingest + in-process delivery worker) pushing to real
HTTP receivers on loopback."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from tests.receivers import Receiver
from tests.waiting import eventually

FAST_RETRY = {"retry_schedule_s": [0.05, 0.1], "timeout_s": 2}


def subscribe(client: TestClient, receiver: Receiver, **extra: Any) -> dict[str, Any]:
    body = {"name": "hooks", "topic": "orders", "url": receiver.url, "start": "earliest", **extra}
    r = client.post("/v1/subscriptions", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def pause(client: TestClient, name: str = "hooks") -> None:
    """Pause, and wait until the worker has applied it: a tick begun after the pause has ended
    (the worker reads subscriptions once per tick) and none of the subscription's pipelines runs."""
    worker = client.app.state.live_status.worker  # type: ignore[attr-defined]  # conftest: delivery in process
    seen = worker.ticks
    assert client.post(f"/v1/subscriptions/{name}/pause").status_code == 200
    deadline = time.monotonic() + 60
    while worker.ticks < seen + 2 or worker.status(name):
        assert time.monotonic() < deadline, "the worker did not apply the pause"
        time.sleep(0.02)


def produce(client: TestClient, n: int, **fields: Any) -> list[dict[str, Any]]:
    r = client.post("/v1/topics/orders/batch?ack=table",
                    json={"messages": [{"value": {"n": i}, **fields} for i in range(n)]})
    assert r.status_code == 200
    return r.json()["results"]


def test_order_within_partition_and_signatures_verify(client: TestClient, orders: str, receiver: Receiver) -> None:
    created = subscribe(client, receiver, ordering="partition", max_in_flight=8)
    secret = created["secret"]
    assert secret.startswith("whsec_")
    assert client.get("/v1/subscriptions/hooks").json()["secret"] != secret  # masked after creation
    produce(client, 60)
    receiver.wait_for(lambda: len(receiver.messages()) >= 60)
    by_partition: dict[int, list[int]] = {}
    for m in receiver.messages():
        by_partition.setdefault(m["partition"], []).append(m["offset"])
    for offsets in by_partition.values():
        assert offsets == sorted(offsets) == list(range(len(offsets)))
    hook = Webhook(secret)
    for r in receiver.received:
        payload = hook.verify(r.body, r.headers)  # raises on a bad signature
        assert payload["topic"] == "orders"
        assert r.headers["lakebroker-offset"] == str(payload["offset"])
        assert r.headers["webhook-id"] == f"msg_orders_{payload['partition']}_{payload['offset']}"
    status = eventually(lambda: (s := client.get("/v1/subscriptions/hooks").json())
                        and not any(p["lag"] for p in s["partitions"]) and s, 10, what="no lag")
    assert sum(p["committed_offset"] for p in status["partitions"]) == 60
    assert all(p["lag"] == 0 for p in status["partitions"])


def test_retries_then_dead_letter_then_replay(client: TestClient, orders: str, receiver: Receiver) -> None:
    failing = {"on": True}

    def behaviour(n: int, body: Any) -> tuple[int, dict[str, str], float]:
        if failing["on"] and body["value"]["n"] == 3:
            return 500, {}, 0.0
        return 200, {}, 0.0

    receiver.behaviour = behaviour
    subscribe(client, receiver, max_attempts=3, **FAST_RETRY)
    produce(client, 6, partition=0)
    receiver.wait_for(lambda: len(receiver.messages()) >= 5)
    assert [m["offset"] for m in receiver.messages()] == [0, 1, 2, 4, 5]  # in order, 3 dead-lettered
    assert receiver.answers.count(500) == 3  # attempts 1..3
    letters = eventually(lambda: client.get("/v1/subscriptions/hooks/dead-letters").json()["dead_letters"], 10,
                         what="a dead letter")
    assert [(d["partition"], d["offset"], d["attempts"], d["last_status"]) for d in letters] == [(0, 3, 3, 500)]
    failing["on"] = False
    r = client.post("/v1/subscriptions/hooks/dead-letters/replay", json={"partition": 0, "from_offset": 3,
                                                                           "to_offset": 3})
    assert r.json() == {"requested": 1}
    receiver.wait_for(lambda: len(receiver.messages()) >= 6)
    assert receiver.messages()[-1]["offset"] == 3
    eventually(lambda: client.get("/v1/subscriptions/hooks/dead-letters").json()["dead_letters"] == [], 10,
               what="the replayed dead letter gone")


def test_retry_after_is_honoured(client: TestClient, orders: str, receiver: Receiver) -> None:
    refused_at: list[float] = []

    def behaviour(n: int, body: Any) -> tuple[int, dict[str, str], float]:
        if n == 0:
            refused_at.append(time.time())  # the retry is timed from the answer, not from the produce
            return 429, {"Retry-After": "1"}, 0.0
        return 200, {}, 0.0

    receiver.behaviour = behaviour
    subscribe(client, receiver, **FAST_RETRY)
    produce(client, 1, partition=0)
    receiver.wait_for(lambda: len(receiver.messages()) == 1)
    assert receiver.received[0].at - refused_at[0] >= 0.9  # not the 50 ms of the schedule
    assert receiver.answers == [429, 200]


def test_rate_limit_is_respected(client: TestClient, orders: str, receiver: Receiver) -> None:
    subscribe(client, receiver, ordering="none", rate_limit_per_s=40, max_in_flight=20)
    produce(client, 120)
    receiver.wait_for(lambda: len(receiver.messages()) >= 120, timeout=30)
    times = sorted(r.at for r in receiver.received)
    # Past the initial burst allowance the limit holds end to end: never faster (a busy host may
    # make it slower; the bucket's exact schedule is test_policies.py's).
    steady = times[10:]
    rate = (len(steady) - 1) / (steady[-1] - steady[0])
    assert rate <= 44, rate


def test_410_disables_the_endpoint_visibly(client: TestClient, orders: str, receiver: Receiver) -> None:
    receiver.behaviour = lambda n, body: (410, {}, 0.0)
    subscribe(client, receiver, **FAST_RETRY)
    produce(client, 3, partition=0)
    state = eventually(lambda: (s := client.get("/v1/subscriptions/hooks").json())["endpoint_state"] == "disabled"
                       and s, 15, what="the endpoint disabled")
    assert "410" in state["disabled_reason"]
    assert receiver.answers == [410]  # nothing more is sent
    assert state["partitions"][0]["committed_offset"] == 0  # nothing skipped
    receiver.behaviour = lambda n, body: (200, {}, 0.0)
    assert client.post("/v1/subscriptions/hooks/resume").json()["endpoint_state"] == "active"
    receiver.wait_for(lambda: len(receiver.messages()) == 3)


def test_seek_redelivers_from_an_offset(client: TestClient, orders: str, receiver: Receiver) -> None:
    subscribe(client, receiver)
    produce(client, 5, partition=1)
    receiver.wait_for(lambda: len(receiver.messages()) == 5)
    r = client.post("/v1/subscriptions/hooks/seek", json={"offsets": {"1": 2}})
    assert r.status_code == 200, r.text
    receiver.wait_for(lambda: len(receiver.messages()) == 8)
    assert [m["offset"] for m in receiver.messages()[5:]] == [2, 3, 4]
    r = client.post("/v1/subscriptions/hooks/seek", json={"to": "latest"})
    produce(client, 1, partition=1)
    receiver.wait_for(lambda: len(receiver.messages()) == 9)
    assert receiver.messages()[-1]["offset"] == 5
    assert client.post("/v1/subscriptions/hooks/seek", json={"offsets": {"1": 99}}).status_code == 416


def test_batches_arrive_as_json_arrays(client: TestClient, orders: str, receiver: Receiver) -> None:
    subscribe(client, receiver, batch_size=10)
    produce(client, 25, partition=2)
    receiver.wait_for(lambda: len(receiver.messages()) == 25)
    assert [m["offset"] for m in receiver.messages()] == list(range(25))
    assert len(receiver.received) < 25


@pytest.mark.parametrize("body, needle", [
    ({"url": "ftp://x"}, "http"),
    ({"url": "http://user:pw@example.com/"}, "credentials"),
    ({"topic": "nope"}, "does not exist"),
    ({"max_in_flight": -1}, "max_in_flight"),
    ({"rate_limit_per_s": 10**9}, "rate_limit_per_s"),
    ({"name": "../x"}, "name"),
    ({"secret": "plain"}, "whsec_"),
    ({"start": "yesterday-ish"}, "timestamp"),
])
def test_bad_subscriptions_are_refused(client: TestClient, orders: str, body: dict[str, Any], needle: str) -> None:
    base = {"name": "s", "topic": "orders", "url": "http://127.0.0.1:9/x"}
    r = client.post("/v1/subscriptions", json={**base, **body})
    assert 400 <= r.status_code < 500, r.text
    assert needle in r.json()["error"]["message"]
    assert client.get("/v1/subscriptions").json() == []


def test_duplicate_name_is_409(client: TestClient, orders: str, receiver: Receiver) -> None:
    subscribe(client, receiver)
    r = client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url})
    assert r.status_code == 409


def test_a_group_past_the_log_end_is_reset_to_it_not_left_to_skip(client: TestClient, orders: str,
                                                                    receiver: Receiver, settings: Any) -> None:
    """After a failover to a replica that is behind (or a restore), the group's offset can be past
    the table's log end; the next messages take those offsets and must still be delivered."""
    from lakebroker.tables.layout import Layout
    from lakebroker.tables.offsets import OffsetReason, OffsetsTable

    produce(client, 5, partition=1)
    subscribe(client, receiver)
    receiver.wait_for(lambda: len(receiver.messages()) == 5)
    pause(client)
    offsets = OffsetsTable(Layout(settings.data_dir))
    offsets.commit("hooks", "orders", {1: 50}, OffsetReason.SEEK)  # as the replica's offsets table might say
    assert client.post("/v1/subscriptions/hooks/resume").status_code == 200
    deadline = time.monotonic() + 20
    while offsets.latest("hooks").get(("hooks", "orders", 1), (None, None))[1] != OffsetReason.RESET.value:
        assert time.monotonic() < deadline, offsets.latest("hooks")
        time.sleep(0.1)
    produce(client, 3, partition=1)
    receiver.wait_for(lambda: len(receiver.messages()) == 8)
    assert [m["offset"] for m in receiver.messages()[5:]] == [5, 6, 7]
    status = client.get("/v1/subscriptions/hooks").json()["partitions"][1]
    assert "past the table's committed end" in (status["last_error"] or "")


def test_messages_removed_before_delivery_are_skipped_visibly(client: TestClient, orders: str,
                                                              receiver: Receiver, settings: Any) -> None:
    """If the log start passes a group's position while it waits (retention by any tool), the worker
    jumps to it with a recorded retention-skip, counts it, and says so in the status."""
    from deltalake import DeltaTable

    from lakebroker.tables.layout import Layout
    from lakebroker.tables.offsets import OffsetsTable

    subscribe(client, receiver)
    pause(client)
    produce(client, 5, partition=1)
    DeltaTable(Layout(settings.data_dir).topic_table("orders")).delete('partition = 1 AND "offset" < 3')
    assert client.post("/v1/subscriptions/hooks/resume").status_code == 200
    receiver.wait_for(lambda: len(receiver.messages()) == 2)
    assert [m["offset"] for m in receiver.messages()] == [3, 4]
    status = client.get("/v1/subscriptions/hooks").json()["partitions"][1]
    assert status["retention_skipped"] == 3
    assert status["last_error"] == "retention removed 3 undelivered messages (0-2)"
    history = OffsetsTable(Layout(settings.data_dir)).latest("hooks")
    assert history[("hooks", "orders", 1)][0] >= 3
