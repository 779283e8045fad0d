"""Creating a subscription: where its group starts, even when the create is cut short."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.subscriptions import SubscriptionStore
from tests.receivers import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _produce(client: TestClient, n: int, first: int) -> None:
    r = client.post("/v1/topics/orders/batch?ack=table",
                    json={"messages": [{"value": {"n": first + i}} for i in range(n)]})
    assert r.status_code == 200, r.text


def test_latest_never_delivers_history_if_start_offsets_are_missing(client: TestClient, orders: str,
                                                                    receiver: Receiver, settings: Settings) -> None:
    """The create writes the subscription row, then the group's START offsets. A worker that
    reads the row before the offsets exist (a tick between the two writes, or a crash between
    them) must still start at the requested position, not at the log start. The gap is made
    deterministic by making the offsets table unwritable (a file where its directory goes), so the
    create stops after its first write; the in-process delivery worker then runs on that state."""
    _produce(client, 30, first=0)  # history, committed to the topic table
    blocker = Path(Layout(settings.data_dir).offsets_table)
    assert not blocker.exists()
    blocker.write_bytes(b"not a table")
    try:
        with pytest.raises(Exception):  # noqa: B017 - any storage error: the point is the state it leaves
            client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                                   "start": "latest"})
    finally:
        blocker.unlink()
    assert "hooks" in SubscriptionStore(Layout(settings.data_dir)).load()  # the first write happened

    worker = client.app.state.live_status  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while len(worker.status("hooks")) < 3:  # the worker leased and started every partition
        assert time.monotonic() < deadline, "the worker did not start the subscription"
        time.sleep(0.05)
    _produce(client, 6, first=30)
    # Each partition delivers in offset order, so history, if it were sent, would come first.
    receiver.wait_for(lambda: len(receiver.messages()) >= 6)
    assert sorted(m["value"]["n"] for m in receiver.messages()) == list(range(30, 36))
