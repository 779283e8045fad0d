"""A node's leases are renewed on time whatever else it is doing: claiming many partitions (a node
taking over a dead node's share, or starting, or making a topic, on a slow machine), or waiting for
a busy data plane (in the cluster soak, a node whose claims or commits held its heartbeat back
lost its 4 s leases, and partitions went back and forth between nodes)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api import cluster as cluster_module
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables.layout import Layout
from lakebroker.tables.ownership import OwnershipTable, read_view
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, TopicStore, new_topic

CLAIM_S = 0.4  # each topic's claim, slowed


async def test_the_loops_beats_claim_beside_the_heartbeats_and_each_partition_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(data_dir=tmp_path / "data", ingest_lease_ttl_s=2, ingest_heartbeat_s=60)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        for name in ("a", "b", "c", "d"):
            await broker.create_topic(new_topic(name, 2))
        everything = broker.ownership.owned_pairs()
        assert len(everything) == 8
        real = cluster_module.claim_partitions
        claims: list[str] = []

        def slow_claim(store: TopicStore, topic: TopicConfig, epochs: dict[int, int], **kw: str) -> object:
            claims.append(topic.name)
            time.sleep(CLAIM_S)
            return real(store, topic, epochs, **kw)

        monkeypatch.setattr(cluster_module, "claim_partitions", slow_claim)
        broker.ownership.disown(everything)  # as after a lost lease: the heartbeat gives them back, to be claimed

        started = time.monotonic()
        await broker.cluster.beat(wait=False)
        assert time.monotonic() - started < CLAIM_S, "the loop's beat ends with its heartbeat"
        assert broker.ownership.owned_pairs() == set(), "the claims run beside it"
        for _ in range(3):  # beats while the claims run: they renew, and claim nothing twice
            await broker.cluster.beat(wait=False)
        while broker.cluster._claims or broker.cluster._openings:
            await asyncio.gather(*broker.cluster._claims, *broker.cluster._openings)
        assert broker.ownership.owned_pairs() == everything
        assert sorted(claims) == ["a", "b", "c", "d"], "each topic claimed once"

        broker.ownership.disown(everything)
        await broker.cluster.beat()  # a topic's creation: every claim made and open at the answer
        assert broker.ownership.owned_pairs() == everything
    finally:
        await broker.stop()


@pytest.mark.parametrize("stuck", ["worker threads", "commit lock"])
async def test_leases_are_renewed_while_the_data_plane_is_stuck(tmp_path: Path, stuck: str) -> None:
    """For three lease TTLs, every shared worker thread is busy (slow Delta reads and commits on a
    loaded machine), or a commit holds the commit lock while the topic follower waits for it to
    take in a topic made through another node: the heartbeat still renews this node's leases on
    time. In the cluster soak, a node whose heartbeat queued behind such work lost its leases, and
    a partition stayed between owners for 20 s."""
    settings = Settings(data_dir=tmp_path / "data", ingest_lease_ttl_s=2, ingest_heartbeat_s=0.25)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    release = threading.Event()
    busy: list[asyncio.Future[bool]] = []
    try:
        topic = await broker.create_topic(new_topic("t", 2))
        pairs = {(topic.topic_id, p) for p in range(2)}
        layout = Layout.of(settings)
        async with contextlib.AsyncExitStack() as stack:
            if stuck == "worker threads":
                loop = asyncio.get_running_loop()
                busy += [loop.run_in_executor(None, release.wait, 30) for _ in range(64)]  # more than the pool
            else:
                await stack.enter_async_context(broker.flusher.commit_lock)  # a long commit
                broker.store.create(new_topic("other", 1))  # through another node: the follower waits
            seen = []
            deadline = time.monotonic() + 3 * settings.ingest_lease_ttl_s
            while time.monotonic() < deadline:
                view = read_view(layout)  # in this thread: the pool may be full
                seen.append({pair: (o.node if (o := view.owner_of(pair)) else None) for pair in pairs})
                await asyncio.sleep(0.2)
        assert {broker.cluster.node} == {node for s in seen for node in s.values()}, \
            "every lease stayed this node's, renewed on time"
    finally:
        release.set()
        await asyncio.gather(*busy)
        await broker.stop()


def _owners(layout: Layout, pairs: set[tuple[str, int]]) -> dict[tuple[str, int], str | None]:
    view = read_view(layout)
    return {pair: (o.node if (o := view.owner_of(pair)) else None) for pair in pairs}


async def test_a_topics_slow_claims_do_not_hold_back_the_renewal_of_other_leases(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic made on a busy node: its claims take longer than the TTL (commits racing the others'
    on a loaded machine). The answer waits for them, up to its bound, but the node's other leases
    are renewed meanwhile. When the creation's beat held every beat back, a busy node lost all its
    leases at each topic made through it, and the partitions went back and forth between nodes."""
    settings = Settings(data_dir=tmp_path / "data", ingest_lease_ttl_s=2, ingest_heartbeat_s=0.25)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        kept = await broker.create_topic(new_topic("kept", 2))
        pairs = {(kept.topic_id, p) for p in range(2)}
        real = cluster_module.claim_partitions

        def slow_claim(store: TopicStore, topic: TopicConfig, epochs: dict[int, int], **kw: str) -> object:
            if topic.name == "slow":
                time.sleep(3 * settings.ingest_lease_ttl_s / 2)
            return real(store, topic, epochs, **kw)

        monkeypatch.setattr(cluster_module, "claim_partitions", slow_claim)
        started = time.monotonic()
        creating = asyncio.create_task(broker.create_topic(new_topic("slow", 2)))
        seen, last_look = [], 0.0
        while not creating.done():
            last_look = time.monotonic() - started  # the read below sees the table as of now or later
            seen.append(await asyncio.to_thread(_owners, Layout.of(settings), pairs))
            await asyncio.sleep(0.2)
        slow = await creating
        assert len(seen) >= 3 and last_look > settings.ingest_lease_ttl_s, \
            "the claims took their time: the leases were looked at past a TTL of them"
        assert {broker.cluster.node} == {node for s in seen for node in s.values()}, \
            "the other leases stayed this node's, renewed on time"
        assert {(slow.topic_id, p) for p in range(2)} <= broker.ownership.owned_pairs(), \
            "claimed and open at the answer"
    finally:
        await broker.stop()


async def test_a_start_whose_claims_take_longer_than_the_ttl_keeps_the_leases_it_took(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node restarted on its data dir takes its share in its first heartbeat, then claims and opens
    it before it serves. On a loaded machine that can take longer than the TTL: the leases it took
    are renewed meanwhile, so no other node takes them over half way (in the nemesis soak a
    restarted node lost what it was claiming, and partitions stayed between owners for 20-80 s)."""
    settings = Settings(data_dir=tmp_path / "data", ingest_lease_ttl_s=2, ingest_heartbeat_s=0.25)
    first = Broker(settings, IngestMetrics(CollectorRegistry()))
    await first.start()
    topics = [await first.create_topic(new_topic(name, 1)) for name in ("a", "b", "c")]
    await first.stop()
    pairs = {(t.topic_id, 0) for t in topics}
    real = cluster_module.claim_partitions
    lock, in_flight, most = threading.Lock(), [0], [0]

    def slow_claim(store: TopicStore, topic: TopicConfig, epochs: dict[int, int], **kw: str) -> object:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(1.5 * settings.ingest_lease_ttl_s)  # each topic's claim outlasts the TTL
        with lock:
            in_flight[0] -= 1
        return real(store, topic, epochs, **kw)

    monkeypatch.setattr(cluster_module, "claim_partitions", slow_claim)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    starting = asyncio.create_task(broker.start())
    try:
        seen: list[tuple[float, dict[tuple[str, int], str | None]]] = []
        while not starting.done():
            seen.append((time.monotonic(), await asyncio.to_thread(_owners, Layout.of(settings), pairs)))
            await asyncio.sleep(0.2)
        await starting
        taken = [(at, s) for i, (at, s) in enumerate(seen) if any(any(t.values()) for _, t in seen[:i + 1])]
        assert taken and taken[-1][0] - taken[0][0] > settings.ingest_lease_ttl_s, \
            "looked at for longer than a TTL after the leases were taken (the claims outlast it)"
        assert all(set(s.values()) == {broker.cluster.node} for _, s in taken), \
            "every lease it took stayed its own while it claimed"
        assert broker.ownership.owned_pairs() == pairs
        assert most[0] == 3, "the three topics were claimed at once"
    finally:
        await broker.stop()


async def test_a_beat_that_waits_also_waits_for_the_openings_of_claims_the_loop_began(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic's creation answers once its partitions are open, even when the loop's heartbeat took
    them first: the loop's claim opens them in a task of its own, begun after the wait began (a
    produce right after the creation got 503 "changing owners")."""
    settings = Settings(data_dir=tmp_path / "data", ingest_lease_ttl_s=2, ingest_heartbeat_s=60)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        await broker.create_topic(new_topic("a", 2))
        everything = broker.ownership.owned_pairs()
        real_claim, real_learn = cluster_module.claim_partitions, cluster_module.placed_by_others

        def slow_claim(store: TopicStore, topic: TopicConfig, epochs: dict[int, int], **kw: str) -> object:
            time.sleep(CLAIM_S)
            return real_claim(store, topic, epochs, **kw)

        def slow_learning(*args: object, **kwargs: object) -> object:
            time.sleep(CLAIM_S)
            return real_learn(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(cluster_module, "claim_partitions", slow_claim)
        monkeypatch.setattr(cluster_module, "placed_by_others", slow_learning)
        broker.ownership.disown(everything)
        await broker.cluster.beat(wait=False)  # the loop's beat: its claim, then its opening, run beside
        assert broker.cluster._claims and not broker.cluster._openings
        await broker.cluster.beat()
        assert broker.ownership.owned_pairs() == everything
    finally:
        await broker.stop()


async def test_a_dead_nodes_partitions_are_taken_when_its_leases_run_out_not_at_the_next_heartbeat(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Another node takes half the partitions and dies (it never beats again). This node's loop
    beats once a minute, yet takes them back when their 2 s leases run out: the outage after an
    owner's death is its lease, not its lease and up to a heartbeat more. The log says what was
    taken, at which epochs, and when it was open again."""
    caplog.set_level(logging.INFO, logger="lakebroker.ingest_api.cluster")
    settings = Settings(data_dir=tmp_path / "data", ingest_lease_ttl_s=2, ingest_heartbeat_s=60)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        await broker.create_topic(new_topic("a", 4))
        everything = broker.ownership.owned_pairs()
        topics = {pair: "a" for pair in everything}
        dead = OwnershipTable(broker.layout, "dead", "http://127.0.0.1:1", ttl_s=2)
        dead.heartbeat(topics)  # joins: the plan gives it half, which this node hands over
        await broker.cluster.beat()
        await broker.cluster.beat()
        taken = dead.heartbeat(topics).taken
        assert len(taken) == 2 and broker.ownership.owned_pairs() == everything - taken
        await broker.cluster.beat()  # sees the dead node's leases; the loop's next beat is a minute away
        started = time.monotonic()
        while broker.ownership.owned_pairs() != everything and time.monotonic() - started < 20:
            await asyncio.sleep(0.05)
        assert broker.ownership.owned_pairs() == everything, "taken without waiting for the next heartbeat"
        owners = read_view(broker.layout).owners
        assert {(owners[pair].node, owners[pair].epoch) for pair in taken} == {(broker.cluster.node, 3)}
        partitions = sorted(p for _, p in taken)
        said: dict[int, int] = {}  # partition -> epoch, as the "took" lines say
        for found in re.finditer(r"took a\[([\d, ]+)\] at epochs? ([\d, ]+)", caplog.text):
            said.update(zip(map(int, found[1].split(", ")), map(int, found[2].split(", ")), strict=True))
        assert {p: said.get(p) for p in partitions} == dict.fromkeys(partitions, 3), caplog.text
        assert f"topic 'a': partitions {partitions} open, " in caplog.text
    finally:
        await broker.stop()


async def test_a_heartbeat_that_takes_a_quarter_of_the_ttl_is_logged_with_the_remedy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(data_dir=tmp_path / "data", ingest_lease_ttl_s=2, ingest_heartbeat_s=60)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        caplog.clear()
        broker.cluster._slow_beat_said = None
        broker.cluster._note_slow_beat(0.4)  # under a quarter of the 2 s TTL
        assert "a heartbeat took" not in caplog.text
        real = broker.cluster.table.heartbeat

        def slow_heartbeat(*args: object, **kwargs: object) -> object:
            time.sleep(0.6)  # over a quarter of the 2 s TTL
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(broker.cluster.table, "heartbeat", slow_heartbeat)
        await broker.cluster.beat()
        await broker.cluster.beat()
        said = [r.getMessage() for r in caplog.records if "a heartbeat took" in r.getMessage()]
        assert len(said) == 1, said  # once a minute at most
        assert "LAKEBROKER_INGEST_LEASE_TTL_S" in said[0]
    finally:
        await broker.stop()
