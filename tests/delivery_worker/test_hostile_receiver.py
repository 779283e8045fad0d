"""A receiver that answers with hostile headers must cost retries, never a wedged partition."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.receivers import Receiver

# Latin-1 encodable, as an HTTP/1.1 server may send them; each one is a 503 with that Retry-After.
# (A huge delta-seconds is no hostile value: it is honoured, capped at an hour.)
HOSTILE_RETRY_AFTER = ["²", "٣".encode().decode("latin-1"), "1e309", "NaN", "-1", "0x10",
                       "Thu, 01 Jan 0000 00:00:00 GMT", "Mon, 99 Xyz 2020 99:99:99 GMT"]


def test_hostile_retry_after_headers_do_not_wedge_the_partition(client: TestClient, orders: str) -> None:
    def behaviour(n: int, body: Any) -> tuple[int, dict[str, str], float]:
        if n < len(HOSTILE_RETRY_AFTER):
            return 503, {"Retry-After": HOSTILE_RETRY_AFTER[n]}, 0.0
        return 200, {}, 0.0

    receiver = Receiver(behaviour=behaviour)
    try:
        r = client.post("/v1/subscriptions", json={
            "name": "hooks", "topic": "orders", "url": receiver.url, "start": "earliest", "ordering": "partition",
            "max_attempts": 20, "retry_schedule_s": [0.05], "timeout_s": 2})
        assert r.status_code == 201, r.text
        r = client.post("/v1/topics/orders/batch?ack=table",
                        json={"messages": [{"value": i, "partition": 0} for i in range(3)]})
        assert r.status_code == 200, r.text
        receiver.wait_for(lambda: len(receiver.messages()) >= 3)
        assert [m["value"] for m in receiver.messages()] == [0, 1, 2]  # in order, once each
        assert receiver.answers[:len(HOSTILE_RETRY_AFTER)] == [503] * len(HOSTILE_RETRY_AFTER)
        receiver.wait_for(lambda: client.get("/v1/subscriptions/hooks").json()["partitions"][0]["committed_offset"]
                          == 3)
    finally:
        receiver.close()
