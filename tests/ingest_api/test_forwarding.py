"""What a forwarding node answers its producer when the owner it forwarded to refuses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lakebroker.ingest_api.forwarding import Forwarder, Refused
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.not_here import NoOwnerYet
from tests.receivers import Receiver


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
