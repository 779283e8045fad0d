"""A heartbeat that has many partitions to claim (a node taking over a dead node's share on a slow
machine) must not hold back the next lease renewal: the loop's beats stop claiming a quarter TTL
after their heartbeat and beat again at once (in the cluster soak, a node whose claims outlasted
its 4 s leases lost them, and the partitions went back and forth between nodes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.metrics import IngestMetrics
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
