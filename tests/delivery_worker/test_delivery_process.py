"""`lakebroker serve` runs its delivery worker as a supervised child process (the default):
a real serve, a real receiver on loopback, real signals."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.receivers import Receiver
from tests.servers import ServerProcess, alive, delivery_child, until

pytestmark = pytest.mark.fault

FAST = {"LAKEBROKER_HEARTBEAT_S": "0.5", "LAKEBROKER_OFFSET_COMMIT_INTERVAL_MS": "200",
        "LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1", "LAKEBROKER_FLUSH_INTERVAL_MS": "50"}


def start(tmp_path: Path, receiver: Receiver) -> tuple[ServerProcess, httpx.Client]:
    server = ServerProcess(tmp_path / "data", env=FAST)
    client = httpx.Client(base_url=server.start(), timeout=30)
    assert client.post("/v1/topics", json={"name": "orders", "partitions": 2}).status_code == 201
    assert client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                                  "start": "earliest", "ordering": "partition"}).status_code == 201
    return server, client


def produce(client: httpx.Client, first: int, n: int) -> None:
    r = client.post("/v1/topics/orders/batch?ack=table", json={"messages": [{"value": first + i} for i in range(n)]})
    assert r.status_code == 200, r.text


def test_a_killed_delivery_process_is_restarted_and_loses_nothing_and_stops_with_serve(
        tmp_path: Path, receiver: Receiver) -> None:
    server, client = start(tmp_path, receiver)
    try:
        first = delivery_child(server)
        produce(client, 0, 50)
        receiver.wait_for(lambda: len({m["value"] for m in receiver.messages()}) == 50)
        workers = {r.headers["lakebroker-worker"] for r in receiver.received}
        assert len(workers) == 1 and next(iter(workers)).startswith("serve-")  # not the ingest process's own

        os.kill(first, signal.SIGKILL)
        second = delivery_child(server, other_than=first)
        produce(client, 50, 50)  # while the new process starts, and after
        receiver.wait_for(lambda: len({m["value"] for m in receiver.messages()}) == 100)
        assert {m["value"] for m in receiver.messages()} == set(range(100))  # nothing lost; redelivery allowed
        by_partition: dict[int, list[int]] = {}
        for m in receiver.messages():
            by_partition.setdefault(m["partition"], []).append(m["offset"])
        for offsets in by_partition.values():  # in order, each restart resuming at or before where it was
            firsts = sorted(set(offsets))
            assert firsts == list(range(len(firsts)))

        # Its metrics reach serve's /metrics: the restart, and deliveries of both incarnations.
        text = client.get("/metrics").text
        assert "lakebroker_delivery_process_restarts_total 1.0" in text
        assert "lakebroker_delivery_process_up 1.0" in text
        delivered = [line for line in text.splitlines()
                     if line.startswith('lakebroker_delivered_messages_total{subscription="hooks"}')]
        assert delivered and float(delivered[0].rsplit(" ", 1)[1]) >= 100

        server.stop()  # SIGTERM: serve stops its child, in order (offsets committed, leases released), then exits
        assert not alive(second)
        log = server.log.read_text()
        assert f"delivery process {second} stopped (code 0)" in log
        assert f"delivery process {second} exited" not in log  # no restart while stopping
    finally:
        server.stop()


def test_a_killed_serve_leaves_no_delivery_process_behind(tmp_path: Path, receiver: Receiver) -> None:
    server, client = start(tmp_path, receiver)
    try:
        child = delivery_child(server)
        produce(client, 0, 10)
        receiver.wait_for(lambda: len(receiver.messages()) >= 10)
        server.kill()  # SIGKILL: no chance to stop the child itself
        until(lambda: not alive(child), "the delivery process exits once serve is gone", timeout=30)
    finally:
        server.stop()
