"""Sends are fenced by the lease: a worker whose heartbeats stall stops POSTing before its lease
can expire, so the next owner never delivers the partition beside it (real Delta tables, real
workers in one event loop, a real receiver on loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lakebroker.delivery_worker import worker as worker_module
from lakebroker.delivery_worker.worker import DeliveryWorker
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import Fence, OffsetReason, OffsetsTable
from lakebroker.tables.schemas import LEASES_SCHEMA, LEASES_SCHEMA_VERSION
from lakebroker.tables.state_table import StateTable
from lakebroker.tables.subscriptions import Ordering, Subscription, SubscriptionStore, new_secret
from lakebroker.tables.topics import TopicStore
from tests.delivery_worker.inproc import stop, subscribe, until, worker, worker_settings
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
        await until(lambda: a.committed_end == 10 and (a.state == "fenced" or a.delivered >= 10),
                    "worker A has read the new messages, and sent them or is fenced")
        order = [r.headers["lakebroker-worker"] for r in list(receiver.received)]
        first_b = order.index("worker-b")
        assert "worker-a" not in order[first_b:], f"both workers delivered partition 0 at once: {order}"
        assert a.state == "fenced" and a.delivered == 5
    finally:
        await stop(*tasks)


async def test_a_lease_that_changed_hands_between_two_heartbeats_restarts_the_pipeline(
        tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    """A worker stalls past its lease; another takes the pair (a higher epoch), commits a position
    below the first worker's, and gives it back before the first worker's next heartbeat. The first
    worker holds the pair at both heartbeats, but its running pipeline's commits are now fenced out:
    it must restart from the committed offset, or the partition never moves again (seen in the soak
    on a loaded machine: committed 213 of 224, nothing in flight, for minutes)."""
    data = tmp_path / "data"
    settings = worker_settings(data)
    create_topic(settings, "t", partitions=1)
    subscribe(data, "t", receiver.url)
    produce(settings, "t", 0, 5)
    layout = Layout(data)
    offsets = OffsetsTable(layout)
    leases = StateTable(layout.leases_table, LEASES_SCHEMA, LEASES_SCHEMA_VERSION)
    a = worker(settings, "worker-a")
    task = asyncio.create_task(a.run())
    try:
        def committed() -> tuple[int, int]:
            c = offsets.positions("hooks")[("hooks", "t", 0)]
            return c.offset, c.epoch

        await until(lambda: ("hooks", "t", 0) in offsets.positions("hooks") and committed()[0] == 5,
                    "worker A delivers and commits the first messages")
        epoch = committed()[1]
        topic_id = TopicStore(layout).load()["t"].topic_id

        # What the other worker did, in the tables, between two of A's heartbeats: it took the lease
        # (epoch + 1), committed offset 3, and A took the lease back (epoch + 2).
        def interlude(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], None]:
            changed = [dict(r) for r in rows]
            for row in changed:
                if row["kind"] == "lease" and (row["group"], row["partition"]) == ("hooks", 0):
                    row["epoch"] = epoch + 2
            return changed, None

        offsets.commit("hooks", "t", {0: 3}, OffsetReason.ACK, fence=Fence(topic_id, epoch + 1))
        leases.mutate(interlude)
        assert committed() == (3, epoch + 1)

        await until(lambda: committed()[0] == 5 and committed()[1] >= epoch + 2,
                    "worker A redelivers 3 and 4 under its new epoch and commits past them")
        offsets_sent = [int(r.headers["lakebroker-offset"]) for r in list(receiver.received)]
        assert offsets_sent.count(3) == 2 and offsets_sent.count(4) == 2, offsets_sent
        assert (f"the lease of hooks partition 0 changed hands meanwhile (its pipeline's epoch {epoch}, the "
                f"lease's now {epoch + 2}, held by worker-a)") in caplog.text
    finally:
        await stop(task)


async def test_a_send_cancelled_before_it_ran_gives_its_window_slot_back(tmp_path: Path, receiver: Receiver) -> None:
    """A pipeline stopped right after it dispatched (a lost lease, a restart) cancels sends that have
    not run a step yet; the slot each took in the subscription's shared window must come back, or
    every later pipeline of the subscription on this worker waits for room that never frees."""
    data = tmp_path / "data"
    settings = worker_settings(data)
    create_topic(settings, "t", partitions=1)
    subscribe(data, "t", receiver.url)
    produce(settings, "t", 0, 5)
    w = worker(settings, "worker-a")
    task = asyncio.create_task(w.run())
    try:
        await until(lambda: len(receiver.messages()) >= 5, "the first messages are delivered")
        pipeline = w._running[("hooks", 0)].pipeline
        window = pipeline.sending.endpoint.window
        await until(lambda: window.in_flight == 0, "the first sends are done")
        pipeline.sending.endpoint.backing_off_until = time.monotonic() + 3600  # hold the next ones in the queue
        await asyncio.to_thread(produce, settings, "t", 0, 5)
        await until(lambda: len(pipeline.queue) > 0, "the next messages are read and queued")
        pipeline.sending.endpoint.backing_off_until = 0.0
        pipeline.sending.dispatch()  # takes a slot, creates a send task that has not run yet
        assert window.in_flight == 1 and pipeline.status.in_flight == 1
        await pipeline.stop()  # cancels it before its first step
        await until(lambda: window.in_flight == 0, "the unused slot comes back")
        assert pipeline.status.in_flight == 0
    finally:
        await stop(task)


async def test_taking_over_many_partitions_reads_and_commits_offsets_once(
        tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that takes over many partitions at once (a peer died, a rebalance) must renew its
    leases on time: one offsets-table read for all its new pipelines, not one each, and on stop one
    commit for all. One read each (~0.2-0.7 s on a busy machine) made a tick outlast a 3 s lease; the
    peer then took the pairs back, and two workers traded them for minutes (the soak's drain)."""
    partitions = 12
    data = tmp_path / "data"
    # No periodic commit during the test: every partition's progress is left for the stop to commit.
    # A lease long enough that a heartbeat slowed by a busy machine does not lose partitions midway:
    # what is counted here is reads and commits, which a lost and retaken lease would repeat.
    settings = worker_settings(data).model_copy(update={"offset_commit_interval_ms": 3_600_000, "lease_ttl_s": 15})
    create_topic(settings, "t", partitions=partitions)
    subscribe(data, "t", receiver.url)
    for p in range(partitions):
        produce(settings, "t", p, 2)
    calls: dict[str, int] = {"positions": 0, "commit_many": 0}
    for name in calls:
        original = getattr(OffsetsTable, name)

        def counted(self: OffsetsTable, *args: Any, _name: str = name, _original: Any = original,
                    **kwargs: Any) -> Any:
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(OffsetsTable, name, counted)
    w = worker(settings, "worker-a")
    task = asyncio.create_task(w.run())
    try:
        # The worker's own positions, not the receiver's count: a receiver records a delivery
        # before its answer reaches the worker.
        await until(lambda: len(w.status("hooks")) == partitions
                    and all(s.position == 2 for s in w.status("hooks").values()), "every partition is delivered")
        assert len(w.owned()) == partitions and calls["positions"] == 1
        assert calls["commit_many"] == 0
        task.cancel()  # a graceful stop: every pipeline stops, then what each delivered is committed
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert calls["commit_many"] == 1
        positions = OffsetsTable(Layout.of(settings)).latest("hooks")
        assert {p: positions[("hooks", "t", p)][0] for p in range(partitions)} == dict.fromkeys(range(partitions), 2)
    finally:
        await stop(task)


async def test_a_send_in_progress_is_cut_off_when_the_lease_ends(tmp_path: Path) -> None:
    """Worker A's first POST hangs at the receiver (the subscription allows 60 s) while A's heartbeats
    stall. The send may not outlive the lease it started under: it is cut off before worker B, the
    next owner, sends the partition, so no two workers are ever posting it at once."""
    seen_by_b: list[str | None] = []  # worker A's state when B's first request arrives
    a_status: list[Any] = []

    def behaviour(n: int, body: Any) -> tuple[int, dict[str, str], float]:
        if n == 1:
            seen_by_b.append(a_status[0].last_error)
        return 200, {}, 30.0 if n == 0 else 0.0

    receiver = Receiver(behaviour=behaviour)
    data = tmp_path / "data"
    settings = worker_settings(data)
    create_topic(settings, "t", partitions=1)
    SubscriptionStore(Layout(data)).create(Subscription(
        name="hooks", topic="t", url=receiver.url, ordering=Ordering.PARTITION, retry_schedule_ms=(50,),
        timeout_ms=60_000, secrets=(new_secret(),)))
    produce(settings, "t", 0, 3)
    stalled = worker(worker_settings(data, heartbeat_s=3600), "worker-a")
    healthy = worker(settings, "worker-b")
    tasks = [asyncio.create_task(stalled.run())]
    try:
        await until(lambda: len(receiver.answers) == 1, "worker A's first POST reaches the receiver")
        a_status.append(stalled.status("hooks")[0])
        tasks.append(asyncio.create_task(healthy.run()))
        await until(lambda: sorted(m["offset"] for m in receiver.messages()) == [0, 1, 2], "B delivers all three")
        assert seen_by_b and "lease ended" in (seen_by_b[0] or ""), \
            f"worker A's send was still running when worker B began: {seen_by_b}"
        assert {r.headers["lakebroker-worker"] for r in list(receiver.received)} == {"worker-b"}
        assert a_status[0].delivered == 0
    finally:
        await stop(*tasks)
        receiver.close()


def _lease_holders(data: Path) -> dict[int, tuple[str, int]]:
    """Each leased partition's holder and epoch, as the leases table says now."""
    leases = StateTable(Layout(data).leases_table, LEASES_SCHEMA, LEASES_SCHEMA_VERSION)
    return {r["partition"]: (r["owner"], r["epoch"]) for r in leases.read() if r["kind"] == "lease"}


def _slow_ticks(monkeypatch: pytest.MonkeyPatch, slowed: DeliveryWorker, wait: Callable[[], object]) -> None:
    """Each of the worker's ticks now calls `wait` before its first table read (a starved machine's
    slow read, or one that hangs)."""
    load = slowed.subscriptions.load

    def slow_load() -> Any:
        wait()
        return load()

    monkeypatch.setattr(slowed.subscriptions, "load", slow_load)


async def test_a_tick_slower_than_the_lease_keeps_the_leases_the_worker_holds(
        tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Renewing the leases does not wait for the rest of a tick. On a loaded machine a tick's table
    reads (subscriptions, topics, leases) took 7-8 s against a 3 s lease: two workers traded every
    partition at each tick, each trade restarting a pipeline from its last commit, until delivery
    fell a minute behind and retention removed messages never delivered (the cluster soak)."""
    data = tmp_path / "data"
    settings = worker_settings(data)  # a 2 s lease
    create_topic(settings, "t", partitions=4)
    subscribe(data, "t", receiver.url)
    a, b = worker(settings, "worker-a"), worker(settings, "worker-b")
    tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    try:
        await until(lambda: len(a.owned()) == 2 and len(b.owned()) == 2, "the two workers share the partitions")
        _slow_ticks(monkeypatch, a, lambda: time.sleep(3))  # each of A's ticks now outlasts its lease
        before, pipelines = _lease_holders(data), dict(a._running)
        for p in range(4):
            await asyncio.to_thread(produce, settings, "t", p, 3)
        await until(lambda: len(receiver.messages()) >= 12, "the new messages are delivered", timeout=30)
        await asyncio.sleep(4)  # two more of A's slow ticks
        assert _lease_holders(data) == before, "the partitions changed hands"
        assert {p: a._running.get(p) for p in pipelines} == pipelines, "A's pipelines were restarted"
        offsets = sorted((r.headers["lakebroker-partition"], r.headers["lakebroker-offset"])
                         for r in list(receiver.received))
        assert len(offsets) == len(set(offsets)) == 12, offsets
    finally:
        await stop(*tasks)


async def test_a_stuck_tick_stops_the_renewals_and_the_partitions_go_to_another_worker(
        tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Renewals apart from the ticks must not keep a worker's partitions while its ticks hang (a
    table read that never returns): after STUCK_TICK_TTLS leases they stop, as if it had died."""
    monkeypatch.setattr(worker_module, "STUCK_TICK_TTLS", 2)  # 4 s with the 2 s lease
    data = tmp_path / "data"
    settings = worker_settings(data)
    create_topic(settings, "t", partitions=4)
    subscribe(data, "t", receiver.url)
    a, b = worker(settings, "worker-a"), worker(settings, "worker-b")
    hung = threading.Event()
    tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    try:
        await until(lambda: len(a.owned()) == 2 and len(b.owned()) == 2, "the two workers share the partitions")
        _slow_ticks(monkeypatch, a, lambda: hung.wait(60))
        produce(settings, "t", 0, 1)
        await until(lambda: len(b.owned()) == 4, "worker B takes the stuck worker's partitions", timeout=30)
        for p in range(4):
            await asyncio.to_thread(produce, settings, "t", p, 2)
        await until(lambda: {r.headers["lakebroker-worker"] for r in list(receiver.received)[-8:]} == {"worker-b"}
                    and len(receiver.messages()) >= 9, "worker B delivers every partition")
    finally:
        hung.set()
        await stop(*tasks)


async def test_a_worker_that_holds_nothing_yet_stays_a_member_through_ticks_slower_than_the_lease(
        tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that joins (or restarts) holds no lease until the others hand it its share, and its
    membership must stay live meanwhile however slow its ticks: expired between two of them, the
    others plan without it, keep its share, and the pairs go back and forth at every tick (the
    cluster soak, after a worker's SIGKILL and restart on a loaded machine)."""
    data = tmp_path / "data"
    settings = worker_settings(data)  # a 2 s lease
    create_topic(settings, "t", partitions=4)
    subscribe(data, "t", receiver.url)
    a, b = worker(settings, "worker-a"), worker(settings, "worker-b")
    tasks = [asyncio.create_task(a.run())]
    try:
        await until(lambda: len(a.owned()) == 4, "worker A takes every partition")
        _slow_ticks(monkeypatch, b, lambda: time.sleep(3))  # each of B's ticks outlasts a lease
        tasks.append(asyncio.create_task(b.run()))
        await until(lambda: len(a.owned()) == 2 and len(b.owned()) == 2, "A hands B its share", timeout=30)
        settled = _lease_holders(data)
        await asyncio.sleep(8)  # a few of B's slow ticks
        assert _lease_holders(data) == settled, "the pairs changed hands again"
    finally:
        await stop(*tasks)


async def test_a_lease_that_ran_out_and_was_taken_again_by_its_worker_keeps_its_pipeline(
        tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """When a worker's renewals come too late (a starved machine), its lease runs out and its next
    heartbeat takes the pair again, one epoch up. No other worker held it in between, so the
    pipeline goes on under the new epoch: restarting it from its last commit at every tick (seen in
    the cluster soak, every pair of both workers, for the whole run) redelivers and falls behind."""
    data = tmp_path / "data"
    settings = worker_settings(data)  # a 2 s lease
    create_topic(settings, "t", partitions=2)
    subscribe(data, "t", receiver.url)
    a = worker(settings, "worker-a")
    task = asyncio.create_task(a.run())
    try:
        await until(lambda: len(a.owned()) == 2, "worker A holds both partitions")
        renew = a.leases.renew

        def late_renew(pairs: set[tuple[str, int]]) -> Any:
            time.sleep(2.5)  # past the lease: the renewal finds it run out, and renews nothing
            return renew(pairs)

        monkeypatch.setattr(a.leases, "renew", late_renew)
        _slow_ticks(monkeypatch, a, lambda: time.sleep(3))  # each tick outlasts the lease too
        before, pipelines = _lease_holders(data), dict(a._running)
        for p in range(2):
            await asyncio.to_thread(produce, settings, "t", p, 3)
        await until(lambda: len(receiver.messages()) >= 6, "the new messages are delivered", timeout=30)
        await until(lambda: all(_lease_holders(data)[p][1] >= before[p][1] + 2 for p in range(2)),
                    "the leases ran out and were taken again twice", timeout=30)
        assert {p: owner for p, (owner, _) in _lease_holders(data).items()} == {0: "worker-a", 1: "worker-a"}
        assert {p: a._running.get(p) for p in pipelines} == pipelines, "A's pipelines were restarted"
        assert "changed hands meanwhile" not in caplog.text
        assert "ran out before this worker renewed it; taken again at epoch" in caplog.text
        offsets = sorted((r.headers["lakebroker-partition"], r.headers["lakebroker-offset"])
                         for r in list(receiver.received))
        assert len(offsets) == len(set(offsets)) == 6, offsets
        await until(lambda: {c.offset for c in OffsetsTable(Layout(data)).positions("hooks").values()} == {3},
                    "A commits under its new epochs")
    finally:
        await stop(task)
