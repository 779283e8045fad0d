"""What a forwarding node sends an owner, and answers its producer when the owner refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from lakebroker.ingest_api.forwarding import Forwarder, Refused
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.not_here import NoOwnerYet
from tests.receivers import Receiver
from tests.servers import AppThread


@pytest.fixture
def owner() -> Iterator[Receiver]:
    statuses = iter([421, 500])

    def behave(n: int, body: Any) -> tuple[int, dict[str, str], float]:
        return next(statuses), {}, 0.0

    receiver = Receiver(behave)
    try:
        yield receiver
    finally:
        receiver.close()


async def test_an_owner_that_no_longer_owns_the_partition_means_retry_not_misdirected(owner: Receiver) -> None:
    """The producer did nothing wrong: the partition moved since this node's last heartbeat. It gets
    503 partition_unavailable with a Retry-After, not the owner's 421."""
    forwarder = Forwarder("node-a", 5)
    try:
        message = NewMessage(b"x", key="k")
        with pytest.raises(NoOwnerYet) as moved:
            await forwarder.batch(owner.url, "orders", [message], [0], AckMode.WAL, None)
        assert moved.value.status == 503 and moved.value.retry_after_s == 1.0
        assert "changing owners" in moved.value.message
        with pytest.raises(Refused) as broken:  # any other failure is passed on as the owner's failure
            await forwarder.batch(owner.url, "orders", [message], [0], AckMode.WAL, None)
        assert broken.value.status == 502 and broken.value.code == "bad_owner_answer"
        assert owner.answers == [421, 500]
    finally:
        await forwarder.close()


async def test_an_owner_that_refuses_connections_means_retry_once_its_lease_moves() -> None:
    """A dead owner refuses connections until its lease runs out and a live node takes its
    partitions: the producer gets 503 partition_unavailable with a Retry-After, as for a partition
    between owners."""
    receiver = Receiver()
    url = receiver.url
    receiver.close()  # nothing listens there any more
    forwarder = Forwarder("node-a", 5)
    try:
        with pytest.raises(NoOwnerYet) as dead:
            await forwarder.batch(url, "orders", [NewMessage(b"x", key="k")], [0], AckMode.WAL, None)
        assert dead.value.status == 503 and dead.value.code == "partition_unavailable"
        assert dead.value.retry_after_s == 1.0 and url in dead.value.message
    finally:
        await forwarder.close()


class RecordingOwner:
    """An owner's batch route on loopback: it records each request's messages and places them one
    offset after another, answering after `delay_s`, or refuses every request with `refuse`."""

    def __init__(self, delay_s: float = 0.05, refuse: tuple[int, str] | None = None) -> None:
        self.requests: list[list[dict[str, Any]]] = []
        self.sizes: list[int] = []
        self.next_offset = 0

        async def batch(request: Request) -> Response:
            body = await request.body()
            messages = orjson.loads(body)["messages"]
            self.requests.append(messages)
            self.sizes.append(len(body))
            await asyncio.sleep(delay_s)
            if refuse is not None:
                status, code = refuse
                return Response(orjson.dumps({"error": {"code": code, "message": "refused"}}), status)
            results = []
            for m in messages:
                results.append({"partition": m["partition"], "offset": self.next_offset, "duplicate": False})
                self.next_offset += 1
            return Response(orjson.dumps({"results": results}), 200, media_type="application/json")

        self.thread = AppThread(Starlette(routes=[Route("/v1/topics/{topic}/batch", batch, methods=["POST"])]))
        self.url = self.thread.start()

    def stop(self) -> None:
        self.thread.stop()


async def test_single_messages_for_one_owner_share_requests_and_each_gets_its_own_placement() -> None:
    """Under load, single messages bound for one owner go together: far fewer requests than
    messages, none over the body bound, and each producer gets the placement of its own message."""
    owner = RecordingOwner()
    forwarder = Forwarder("node-a", 5, max_request_bytes=4096)
    try:
        messages = [NewMessage(orjson.dumps({"n": i}), "json", key=f"k{i}") for i in range(300)]
        placed = await asyncio.gather(*(forwarder.one(owner.url, "orders", m, i % 3, AckMode.WAL, None)
                                        for i, m in enumerate(messages)))
        sent = [m for request in owner.requests for m in request]
        assert sorted(m["value"]["n"] for m in sent) == list(range(300))  # each once
        assert len(owner.requests) < 300 / 4, len(owner.requests)
        assert max(owner.sizes) <= 4096, max(owner.sizes)
        offset_of = {m["value"]["n"]: offset for offset, m in enumerate(sent)}
        for i, (partition, offset, duplicate, _) in enumerate(placed):
            assert (partition, offset, duplicate) == (i % 3, offset_of[i], False), i
        # An idle producer waits for nothing: alone, a message goes at once, in a request of its own.
        await forwarder.one(owner.url, "orders", messages[0], 0, AckMode.WAL, None)
        assert len(owner.requests[-1]) == 1
    finally:
        await forwarder.close()
        owner.stop()


async def test_a_refusal_of_a_shared_request_is_every_message_answer() -> None:
    owner = RecordingOwner(refuse=(503, "partition_unavailable"))
    forwarder = Forwarder("node-a", 5)
    try:
        answers = await asyncio.gather(*(forwarder.one(owner.url, "orders", NewMessage(b"x"), 0, AckMode.TABLE,
                                                       "Bearer t") for _ in range(50)), return_exceptions=True)
        assert all(isinstance(a, NoOwnerYet) and a.retry_after_s == 1.0 for a in answers), answers
        assert sum(len(r) for r in owner.requests) == 50 and len(owner.requests) < 50
    finally:
        await forwarder.close()
        owner.stop()


async def test_messages_of_different_credentials_or_acks_never_share_a_request() -> None:
    """The owner checks the caller's token on the request: a token's messages travel only with its own."""
    seen: list[tuple[str | None, str]] = []
    owner = RecordingOwner()
    forwarder = Forwarder("node-a", 5)
    real_post = forwarder._post

    async def post(url: str, topic: str, body: bytes, ack: AckMode, authorization: str | None) -> list[Any]:
        seen.extend((authorization, ack.value) for _ in orjson.loads(body)["messages"])
        for m in orjson.loads(body)["messages"]:
            assert m["value"] == f"{authorization}/{ack.value}", (m, authorization, ack)
        return await real_post(url, topic, body, ack, authorization)

    forwarder._post = post  # type: ignore[method-assign]
    try:
        calls = [(token, ack) for token in ("Bearer a", "Bearer b", None) for ack in (AckMode.WAL, AckMode.TABLE)]
        await asyncio.gather(*(forwarder.one(owner.url, "orders", NewMessage(f"{token}/{ack.value}".encode()), 0,
                                             ack, token) for token, ack in calls * 20))
        assert len(seen) == 120
    finally:
        await forwarder.close()
        owner.stop()
