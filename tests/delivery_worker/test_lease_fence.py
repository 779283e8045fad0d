"""Sends are fenced by the lease: a worker whose heartbeats stall stops POSTing before its lease
can expire, so the next owner never delivers the partition beside it (real Delta tables, real
workers in one event loop, a real receiver on loopback)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from tests.delivery_worker.inproc import subscribe, until, worker, worker_settings
from tests.receivers import Receiver
from tests.spark_pipeline.topics import create_topic, produce


async def test_a_worker_whose_heartbeats_stall_stops_sending_before_the_next_owner_starts(
        tmp_path: Path, receiver: Receiver) -> None:
    data = tmp_path / "data"
    settings = worker_settings(data)
    create_topic(settings, "t", partitions=1)
    subscribe(data, "t", receiver.url)
    produce(settings, "t", 0, 5)
    # A heartbeats once and then not for an hour: a tick loop that is stuck (a slow or failing tick).
    stalled = worker(worker_settings(data, heartbeat_s=3600), "worker-a")
    healthy = worker(settings, "worker-b")
    tasks = [asyncio.create_task(stalled.run())]
    try:
        await until(lambda: len(receiver.messages()) >= 5, "worker A delivers the first messages")
        tasks.append(asyncio.create_task(healthy.run()))
        await until(lambda: healthy.owned() == [("hooks", 0)], "worker B takes the expired lease")
        await asyncio.to_thread(produce, settings, "t", 0, 5)

        def by(worker: str) -> list[int]:
            return [int(r.headers["lakebroker-offset"]) for r in list(receiver.received)
                    if r.headers["lakebroker-worker"] == worker]

        await until(lambda: set(range(5, 10)) <= set(by("worker-b")), "worker B delivers the new messages")
        a = stalled.status("hooks")[0]  # A's pipeline is still running: nothing told it to stop
        await until(lambda: a.log_end == 10 and (a.state == "fenced" or a.delivered >= 10),
                    "worker A has read the new messages, and sent them or is fenced")
        order = [r.headers["lakebroker-worker"] for r in list(receiver.received)]
        first_b = order.index("worker-b")
        assert "worker-a" not in order[first_b:], f"both workers delivered partition 0 at once: {order}"
        assert a.state == "fenced" and a.delivered == 5
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
