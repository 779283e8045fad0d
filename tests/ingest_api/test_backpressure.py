"""A node holds at most `max_backlog_bytes` of accepted rows not yet in Delta (pending, and the commit
in progress): a produce that finds the budget full waits for a commit to make room, up to
`backpressure_wait_ms`, and only then is refused with 429. So a flood is slowed to the pace of the
commits instead of refused, and memory stays bounded by bytes whatever the load."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.arrow_batch import parse_arrow_batch
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.router import Router
from lakebroker.server import build_app
from lakebroker.tables import delta
from lakebroker.tables.errors import Backpressure, InvalidRequest, TooLarge
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic

BUDGET = 40_000
BATCH = [NewMessage(value=b"v" * 100) for _ in range(100)]  # about 15 KB accepted


async def test_a_flood_waits_for_room_and_the_backlog_stays_within_its_bytes(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=3_600_000,  # flushed only when asked
                        max_backlog_bytes=BUDGET, backpressure_wait_ms=60_000)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        topic = await broker.create_topic(new_topic("t", 2))
        floods = [asyncio.create_task(broker.local.produce("t", BATCH, AckMode.WAL)) for _ in range(12)]
        most = 0
        commits = 0
        while True:
            for _ in range(20):
                await asyncio.sleep(0.01)
                most = max(most, broker.backlog_bytes)
            if all(f.done() for f in floods):
                break
            assert broker.backlog_bytes > BUDGET, "produces wait while there is room"
            await broker.flusher.flush_round()  # a commit makes room; the waiters go on
            commits += 1
        assert commits >= 3, "the produces were taken without waiting for the commits"
        assert [len(f.result()) for f in floods] == [100] * 12, "a produce was refused instead of waiting"
        # Over the budget by at most the requests let in by one commit's room: one each.
        assert most <= BUDGET + 2 * 15_000 + 12 * 15_000 // 4
        await broker.flusher.flush_once()
        rows = delta.load(broker.layout.topic_table(topic)).to_pyarrow_table()
        assert rows.num_rows == 1200
        assert broker.metrics.backpressure_waits._value.get() > 0
    finally:
        await broker.stop()


async def test_a_produce_that_finds_no_room_in_time_is_refused_with_the_limit_named(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=3_600_000, max_backlog_bytes=1,
                        backpressure_wait_ms=200)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        await broker.create_topic(new_topic("t", 1))
        await broker.local.produce("t", BATCH, AckMode.WAL)
        with pytest.raises(Backpressure, match="limit 1"):
            await broker.local.produce("t", BATCH, AckMode.WAL)
    finally:
        await broker.stop()



async def test_a_malformed_produce_is_refused_for_its_fault_without_waiting_for_room(tmp_path: Path) -> None:
    """The rules of the request come before the wait for room: under a full budget, a request that
    breaks one is answered for what it broke, at once, not 429 (or its error) after the wait."""
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=3_600_000, max_backlog_bytes=1,
                        backpressure_wait_ms=5_000)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        topic = await broker.create_topic(new_topic("t", 2))
        await broker.local.produce("t", BATCH, AckMode.WAL)
        assert broker.backlog_bytes > 1
        huge = NewMessage(value=b"v" * (topic.max_message_bytes + 1))
        router = Router(broker)
        with pytest.raises(TooLarge):
            await broker.local.produce("t", [huge], AckMode.WAL)
        with pytest.raises(TooLarge):
            await router.produce("t", [huge], AckMode.WAL)
        with pytest.raises(InvalidRequest, match="no messages"):
            await router.produce("t", [], AckMode.WAL)
        with pytest.raises(InvalidRequest, match="partition 7 is out of range"):
            await router.produce("t", [NewMessage(value=b"v", partition=7)], AckMode.WAL)
        oversized = _arrow_body([b"v" * (topic.max_message_bytes + 1)])
        with pytest.raises(TooLarge):
            await broker.local.produce_columns("t", parse_arrow_batch(oversized, 1 << 30), AckMode.WAL)
        assert broker.metrics.backpressure_waits._value.get() == 0, "a request that breaks a rule waited for room"
    finally:
        await broker.stop()


def _arrow_body(values: list[bytes] | None = None) -> bytes:
    table = pa.table({"value": pa.array(["v" * 100] * 100, pa.string()) if values is None else
                      pa.array(values, pa.binary())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    # Commits every 300 ms: each produce after the first finds the budget full and waits for one.
    settings = Settings(data_dir=tmp_path / "d", max_backlog_bytes=1, flush_interval_ms=300,
                        backpressure_wait_ms=30_000, auth="off")
    with TestClient(build_app(settings)) as client:
        assert client.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
        yield client


def test_every_batch_door_waits_for_room_instead_of_answering_429(client: TestClient) -> None:
    json_batch = {"messages": [{"value": "v" * 100}] * 100}
    for _ in range(2):
        assert client.post("/v1/topics/t/batch", json=json_batch).status_code == 200
        assert client.post("/v1/topics/t/batch", content=_arrow_body(),
                           headers={"content-type": "application/vnd.apache.arrow.stream"}).status_code == 200
        r = client.post("/topics/t", json={"records": [{"value": "v" * 100}] * 100},
                        headers={"content-type": "application/vnd.kafka.json.v2+json"})
        assert r.status_code == 200, r.text
    waits = [line for line in client.get("/metrics").text.splitlines()
             if line.startswith("lakebroker_backpressure_waits_total ")]
    assert waits and float(waits[0].split()[1]) >= 5
