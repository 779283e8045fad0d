"""Topic changes made through another node reach this one within a heartbeat or two, even while
one of its heartbeats is busy (claiming many partitions after a start or a failover can take
seconds): a topic deleted elsewhere must not stay served here meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api import broker as broker_module
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.not_here import NoOwnerYet
from lakebroker.tables.errors import NotFound
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, new_topic

HEARTBEAT_S = 0.2


def _node(tmp_path: Path, name: str, port: int, **overrides: Any) -> Broker:
    settings = Settings(data_dir=tmp_path / name, tables_uri=str(tmp_path / "tables"), port=port,
                        ingest_heartbeat_s=HEARTBEAT_S, **overrides)
    return Broker(settings, IngestMetrics(CollectorRegistry()))


async def _until(check: object, what: str, within_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.05)


async def test_a_topic_deleted_elsewhere_is_refused_here_while_a_heartbeat_is_stuck(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _node(tmp_path, "a", 18301), _node(tmp_path, "b", 18302)
    await a.start()
    await b.start()
    release = asyncio.Event()
    try:
        await a.create_topic(new_topic("t", 2))
        await _until(lambda: "t" in b.topics, "b serves the new topic", 5)

        stuck = asyncio.Event()

        async def busy_beat() -> dict[tuple[str, int], int]:  # a heartbeat stuck for as long as the test lets it
            stuck.set()
            await release.wait()
            return {}

        monkeypatch.setattr(b.cluster, "_beat", busy_beat)
        b.cluster.wake()
        await asyncio.wait_for(stuck.wait(), 5)

        await a.delete_topic("t")
        await _until(lambda: "t" not in b.topics, "b forgets the topic deleted through a", 10 * HEARTBEAT_S)
        with pytest.raises(NotFound):
            b.topic("t")
        assert not release.is_set() and b.cluster._beat is busy_beat, "taken in beside the stuck beat"
    finally:
        release.set()
        await b.stop()
        await a.stop()


async def test_a_topic_is_created_and_answered_while_a_heartbeat_is_stuck_and_owned_once_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A beat busy claiming another node's share can outlast a client's timeout on a loaded machine
    (the cluster soak saw a topic's creation go unanswered for 60 s): the creation waits for the
    new partitions' owners a bounded time, answers, and the beat it asked for runs once the busy
    one ends."""
    monkeypatch.setattr(broker_module, "OWNERS_WAIT_S", 0.5)
    a = _node(tmp_path, "a", 18303)
    await a.start()
    release = asyncio.Event()
    real_beat = a.cluster._beat
    try:
        stuck = asyncio.Event()

        async def busy_beat() -> dict[tuple[str, int], int]:
            if not release.is_set():
                stuck.set()
                await release.wait()
            return await real_beat()

        monkeypatch.setattr(a.cluster, "_beat", busy_beat)
        a.cluster.wake()
        await asyncio.wait_for(stuck.wait(), 5)

        created = await asyncio.wait_for(a.create_topic(new_topic("t", 2)), 5)
        assert created.name == "t" and "t" in a.topics
        assert not a.ownership.owns("t", 0) and not a.ownership.owns("t", 1), "answered before the stuck beat ended"
        with pytest.raises(NoOwnerYet):
            await a.local.produce("t", [NewMessage(value=b"early", partition=0)], AckMode.WAL)
        release.set()
        await _until(lambda: a.ownership.owns("t", 0) and a.ownership.owns("t", 1),
                     "the new partitions get their owner", 10)
        [placed] = await a.local.produce("t", [NewMessage(value=b"later", partition=0)], AckMode.WAL)
        assert placed.offset == 0
    finally:
        release.set()
        await a.stop()


class _WatchedLock(asyncio.Lock):
    """A lock that says when someone first waits for it."""

    def __init__(self) -> None:
        super().__init__()
        self.contended = asyncio.Event()

    async def acquire(self) -> bool:
        if self.locked():
            self.contended.set()
        return await super().acquire()


async def test_a_topic_change_is_taken_in_between_two_topics_commits_of_a_flush(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking in a topic change waits for the commit in progress, not for the rest of the flush: on
    S3 under load a flush of every topic's share takes seconds, and a node that waited for all of
    it served a deleted incarnation of a re-created topic for over 10 s (the cluster soak)."""
    # The node's own flushes wait an hour: only this test's flush commits what it produces (a
    # background flush begun meanwhile held the flush with its own `first` and timed the test out).
    node = _node(tmp_path, "a", 18304, flush_interval_ms=3_600_000)
    await node.start()
    gate, followed = threading.Event(), threading.Event()
    real = node.flusher.commits.commit

    def commit(topic: TopicConfig, records: list[Any]) -> dict[int, int]:
        if topic.name == "first":
            gate.wait(20)  # a slow commit, in progress as the change is seen
        else:
            followed.wait(20)  # the next topic's commit comes after the change is taken in
        return real(topic, records)

    try:
        await node.create_topic(new_topic("first", 1))
        await node.create_topic(new_topic("second", 1))
        await node.local.produce("first", [NewMessage(value=b"1")], AckMode.WAL)
        await node.local.produce("second", [NewMessage(value=b"2"), NewMessage(value=b"3")], AckMode.WAL)
        monkeypatch.setattr(node.flusher.commits, "commit", commit)
        # The node's own follower, stopped: one that read the topic table before the change and
        # queued for the lock first would take in nothing and leave this test's call behind `second`.
        follower = node.cluster._follower
        assert follower is not None
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        # So are the beats creating the topics asked for (cluster.beat_for): on a loaded machine one
        # outlives its create, and it takes in topic changes first, beside this test's call.
        await asyncio.gather(*list(node.cluster._asked))
        lock = node.flusher.commit_lock = _WatchedLock()
        flushing = asyncio.create_task(node.flusher.flush_round())
        await _until(lock.locked, "the flush commits `first`", 5)
        node.store.create(new_topic("made-elsewhere", 1))  # through another node
        following = asyncio.create_task(node.follow_topics())
        # The change must be queued for the lock before `first` is done (reading the topic table can
        # take seconds on a loaded machine); one that comes later rightly waits for `second` too.
        await asyncio.wait_for(lock.contended.wait(), 20)
        gate.set()
        await asyncio.wait_for(following, 10)
        assert "made-elsewhere" in node.topics, "taken in once `first` is committed"
        followed.set()
        assert await asyncio.wait_for(flushing, 10)
    finally:
        gate.set()
        followed.set()
        await node.stop()
