"""An operator's `wal skip` on a node deposed under it: another node claimed the held partition in
the topic table. The skip's commit is fenced as a flush is, so it lands nothing, and the node gives
the partition up as after a fenced flush."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables import delta, fencing
from lakebroker.tables.topics import Holes
from tests.delivery_worker.inproc import until
from tests.ingest_api.test_wal_damage import damaged_broker, offsets_in_delta

pytestmark = pytest.mark.fault


async def test_a_deposed_nodes_skip_is_refused_and_leaves_the_table_as_it_was(tmp_path: Path) -> None:
    settings, _ = await damaged_broker(tmp_path)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        await until(lambda: offsets_in_delta(broker, "t", 0) == list(range(7)), "t/0 up to the damage", timeout=20)
        [damage] = broker.damage.all()
        uri = broker.layout.topic_table("t")
        assert fencing.claim(delta.load(uri), {0: broker.ownership.epochs[damage.key] + 1}, node="intruder") == {0: 7}

        with pytest.raises(fencing.Deposed) as refused:
            await broker.skip_lost("t", 0, "test")
        assert (refused.value.status, refused.value.code) == (503, "partition_moved")
        assert damage.key not in broker.ownership.epochs, "given up, as after a fenced flush"
        table = delta.load(uri)
        assert delta.committed_end(table, 0) == 7, "the end stays where the new owner goes on from"
        assert Holes.of(table.metadata().configuration).lost == {}
    finally:
        await broker.stop()
