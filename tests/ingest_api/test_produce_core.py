"""The produce core (ingest_api/produce_core.py) on a real broker: authorization is its first rule
for every shape of request, a request answered message by message keeps each message's own
refusal in its slot, and a core with no router refuses another node's partition rather than
forwarding it. The doors' side of the same rules is tests/ingest_api/test_door_parity.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.arrow_batch import parse_arrow_batch
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.chunks import ColumnarBatch
from lakebroker.ingest_api.local_produce import OneMessage, ProduceResult
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.not_here import NoOwnerYet, NotOwner
from lakebroker.ingest_api.produce_core import THIS_NODE, ProduceCore, ProduceRequest
from lakebroker.tables import delta
from lakebroker.tables.errors import Forbidden, MessageTooLarge, NoSuchPartition
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import ApiToken, Scope
from lakebroker.tables.topics import new_topic

pytestmark = [pytest.mark.timeout(120)]
CONSUMER = ApiToken(token_id="c1", scopes=frozenset({Scope.CONSUME}), name="reader")
ELSEWHERE = ApiToken(token_id="p1", scopes=frozenset({Scope.PRODUCE}), name="other topics", topics=("other-*",))


def _columns(values: list[bytes]) -> ColumnarBatch:
    table = pa.table({"value": pa.array(values, pa.binary())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return parse_arrow_batch(sink.getvalue().to_pybytes(), 1 << 20)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=3_600_000, max_backlog_bytes=1,
                        backpressure_wait_ms=5_000)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    await broker.create_topic(new_topic("t", 2, max_message_bytes=100))
    try:
        yield broker
    finally:
        await broker.stop()


async def test_authorization_comes_first_for_every_shape_of_request(broker: Broker) -> None:
    """Before admission: an oversized message from a caller without the right is 403, not 413,
    and is not counted as refused for its size; a full backlog is not waited for either."""
    core = ProduceCore(broker, router=None)
    huge = NewMessage(value=b"v" * 1_000)
    await core.produce_batch(ProduceRequest("t", [NewMessage(value=b"x" * 50)], AckMode.WAL, THIS_NODE))
    assert broker.backlog_bytes > 1  # the budget is full: admission would wait 5 s
    for principal, reason in ((CONSUMER, "lacks the produce scope"), (ELSEWHERE, "may not use topic 't'")):
        for shape in ("one", "start", "batch", "columns", "each"):
            request = ProduceRequest("t", huge if shape in ("one", "start") else
                                     _columns([huge.value or b""]) if shape == "columns" else [huge],
                                     AckMode.WAL, principal)
            with pytest.raises(Forbidden, match=reason):
                if shape == "one":
                    await core.produce_one(request)
                elif shape == "start":
                    core.start_one(request, None)
                elif shape in ("batch", "columns"):
                    await core.produce_batch(request)
                else:
                    await core.produce_each(request)
    assert broker.metrics.rejected_for("too_large")._value.get() == 0
    assert broker.metrics.backpressure_waits._value.get() == 0


async def test_a_request_answered_message_by_message_keeps_each_refusal_in_its_slot(broker: Broker) -> None:
    core = ProduceCore(broker, router=None)
    broker.admission.max_backlog_bytes = 1 << 30
    sent = [NewMessage(value=b"a", partition=0), NewMessage(value=b"v" * 101, partition=0),
            NewMessage(value=b"b", partition=5), NewMessage(value=b"c", partition=0)]
    answers = await core.produce_each(ProduceRequest("t", sent, AckMode.WAL, THIS_NODE))
    assert [type(a) for a in answers] == [ProduceResult, MessageTooLarge, NoSuchPartition, ProduceResult]
    assert [(a.partition, a.offset) for a in answers if isinstance(a, ProduceResult)] == [(0, 0), (0, 1)]
    too_large, missing = answers[1], answers[2]
    assert isinstance(too_large, MessageTooLarge) and (too_large.size, too_large.limit) == (101, 100)
    assert isinstance(missing, NoSuchPartition) and (missing.partition, missing.partitions) == (5, 2)
    await broker.flusher.flush_once()
    rows = delta.load(broker.layout.topic_table(broker.topic("t"))).to_pyarrow_table()
    assert sorted(rows.column("value").to_pylist()) == [b"a", b"c"]
    # Every message refused: nothing is produced, and each slot says why.
    answers = await core.produce_each(ProduceRequest("t", [sent[1]], AckMode.WAL, THIS_NODE))
    assert [type(a) for a in answers] == [MessageTooLarge]


async def test_a_core_without_a_router_refuses_another_nodes_partition(broker: Broker) -> None:
    core = ProduceCore(broker, router=None)
    broker.admission.max_backlog_bytes = 1 << 30
    broker.cluster.drain()  # claims nothing back
    broker.ownership.disown({(broker.topic("t").topic_id, 1)})
    one = core.start_one(ProduceRequest("t", NewMessage(value=b"p0", partition=0), AckMode.WAL, THIS_NODE), None)
    assert isinstance(one, OneMessage)
    with pytest.raises((NotOwner, NoOwnerYet)):
        await core.produce_one(ProduceRequest("t", NewMessage(value=b"p1", partition=1), AckMode.WAL, THIS_NODE))
    with pytest.raises((NotOwner, NoOwnerYet)):
        await core.produce_batch(ProduceRequest("t", [NewMessage(value=b"p1", partition=1)], AckMode.WAL, THIS_NODE))
