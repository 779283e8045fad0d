"""A heartbeat that has many partitions to claim (a node taking over a dead node's share on a slow
machine) must not hold back the next lease renewal: the loop's beats stop claiming a quarter TTL
after their heartbeat and beat again at once (in the cluster soak, a node whose claims outlasted
its 4 s leases lost them, and the partitions went back and forth between nodes)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables.layout import Layout
from lakebroker.tables.ownership import read_view
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, new_topic

CLAIM_S = 0.4  # each topic's claim, slowed; the TTL's quarter is 0.5 s


async def test_the_loops_beats_claim_for_a_quarter_ttl_then_renew_first(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(data_dir=tmp_path / "data", ingest_lease_ttl_s=2, ingest_heartbeat_s=60)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        for name in ("a", "b", "c", "d"):
            await broker.create_topic(new_topic(name, 2))
        everything = broker.owned_pairs()
        assert len(everything) == 8
        real = broker.cluster._claim_in_table

        def slow_claim(topic: TopicConfig, epochs: dict[int, int]) -> dict[int, tuple[int, int | None]]:
            time.sleep(CLAIM_S)
            return real(topic, epochs)

        monkeypatch.setattr(broker.cluster, "_claim_in_table", slow_claim)
        broker.disown(everything)  # as after a lost lease: the heartbeat gives them back, to be claimed

        async def bounded_beat() -> bool:
            """A loop's beat; whether it asked for the next at once."""
            await broker.cluster.beat(bounded=True)
            again = broker.cluster._wake.is_set()
            await asyncio.gather(*broker.cluster._openings)  # the claimed partitions open beside the beats
            return again

        assert await bounded_beat(), "the next beat comes at once"
        claimed = broker.owned_pairs()
        assert 0 < len(claimed) <= 4, "at most two topics' claims fit in the quarter TTL"
        for _ in range(6):
            if broker.owned_pairs() == everything:
                break
            await bounded_beat()
        assert broker.owned_pairs() == everything, "the next beats claim the rest"

        broker.disown(everything)
        await broker.cluster.beat()  # not bounded (a start, a topic's creation): every claim in one beat
        assert broker.owned_pairs() == everything
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
