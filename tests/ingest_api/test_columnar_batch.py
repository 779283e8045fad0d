"""The columnar batch path answers, partitions, numbers and stores a batch exactly as the
per-message path does, and its WAL chunks survive a crash (replayed once, ids still deduplicated)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.body import batch_items
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.chunks import BatchResults, ColumnarBatch
from lakebroker.ingest_api.columnar import columns_of, parse_batch_body
from lakebroker.ingest_api.local_produce import ProduceResult
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import CHUNK_MAGIC
from lakebroker.ingest_api.results_json import batch_results_json
from lakebroker.ingest_api.routes.produce import _batch_results
from lakebroker.tables import delta
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic

JSON, NDJSON = "application/json", "application/x-ndjson"
PARTITIONS = 4


def _json(messages: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"messages": messages})


def _ndjson(messages: list[dict[str, Any]]) -> bytes:
    return b"\n".join(orjson.dumps(m) for m in messages) + b"\n"


BODIES = {  # each is produced twice in a row: round-robin state and dedup carry from the first to the second
    "keyless": (JSON, _json([{"value": f"v{i} ünïcode"} for i in range(23)])),
    "keyed": (NDJSON, _ndjson([{"key": f"user-{i % 7}", "value": "x" * i} for i in range(40)])),
    "explicit": (JSON, _json([{"partition": i % PARTITIONS, "value": f"p{i}"} for i in range(10)])),
    "mixed": (NDJSON, _ndjson([{"value": "a"}, {"key": "k", "value": None}, {"partition": 3, "key": "k", "value": ""},
                               {"key": None, "value": "b", "partition": None}, {"key": "", "value": "c"}])),
    "ids": (JSON, _json([{"id": f"m{i % 5}", "key": f"k{i}", "value": f"v{i}"} for i in range(12)]
                        + [{"value": "no id"}])),
    # all duplicates the second time
    "all-ids": (JSON, _json([{"id": "a1", "value": "x"}, {"id": "a2", "value": "y"}])),
    # keyless runs over several partitions, with keyed, explicit and duplicate messages among them
    "runs": (NDJSON, _ndjson([{"key": "k", "value": f"r{i}"} if i % 97 == 0 else
                              {"partition": 1, "value": f"r{i}"} if i % 89 == 0 else
                              {"id": f"r{i % 400}", "value": f"r{i}"} if i % 7 == 0 else {"value": f"r{i}"}
                              for i in range(900)])),
    # no ids, keyless, over 3 MiB: runs over several partitions, each stored as a slice of the request
    "big-runs": (JSON, _json([{"value": f"{i:04d}" + "x" * 1000} for i in range(3000)])),
}


def _broker(tmp: Path, name: str, flush_interval_ms: int = 20) -> Broker:
    settings = Settings(data_dir=tmp / name, flush_interval_ms=flush_interval_ms)
    return Broker(settings, IngestMetrics(CollectorRegistry()))


def _as_list(r: BatchResults) -> list[ProduceResult]:
    return [ProduceResult(p, None if o < 0 else o, d, None if t < 0 else t)
            for p, o, d, t in zip(r.partition.tolist(), r.offset.tolist(), r.duplicate.tolist(),
                                  r.timestamp_us.tolist(), strict=True)]


async def _settled(broker: Broker) -> None:
    """Everything queued is in the WAL (ack=none answers first) and then in Delta."""
    while broker.committer.queued_bytes:  # the committer task's groups, never a second writer beside it
        await asyncio.sleep(0.005)
    assert await broker.flusher.flush_once()


def _rows(broker: Broker, topic: str) -> list[dict[str, Any]]:
    table = delta.open_table(broker.layout.topic_table(topic))
    assert table is not None
    rows = table.to_pyarrow_table().sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()
    for row in rows:
        del row["timestamp"]  # log-append time: each broker stamps its own
    return rows


def _shown(body: bytes) -> list[dict[str, Any]]:
    results = orjson.loads(body)["results"]
    for r in results:
        assert (r.pop("timestamp") is None) == (r["offset"] is None)
    return list(results)


@pytest.mark.parametrize("ack", [AckMode.WAL, AckMode.TABLE, AckMode.NONE])
async def test_columnar_batch_equals_the_per_message_path(tmp_path: Path, ack: AckMode) -> None:
    per_message, columnar = _broker(tmp_path, "per-message"), _broker(tmp_path, "columnar")
    for broker in (per_message, columnar):
        await broker.start()
        await broker.create_topic(new_topic("t", PARTITIONS))
    try:
        for name, (kind, body) in BODIES.items():
            for attempt in range(2):
                items = batch_items(kind, body)
                batch = columns_of(items)
                assert batch is not None, f"{name}: not taken by the columnar path"
                placed = await per_message.local.produce("t", items.messages(), ack)
                expected = orjson.dumps({"results": _batch_results(placed)})
                results = await columnar.local.produce_columns("t", batch, ack)
                got = batch_results_json(results)
                # the same bytes as the per-message renderer makes of the same results
                assert got == orjson.dumps({"results": _batch_results(_as_list(results))})
                assert _shown(got) == _shown(expected), f"{name}, attempt {attempt}"
        for broker in (per_message, columnar):
            await _settled(broker)
        stored = _rows(columnar, "t")
        assert stored == _rows(per_message, "t")
        with_id = [i for i in range(900) if i % 7 == 0 and i % 97 and i % 89]
        # the ids body: its 5 ids once, its id-less message twice; the runs body: its ids once too
        runs_rows = 2 * (900 - len(with_id)) + len({i % 400 for i in with_id})
        assert len(stored) == 2 * (23 + 40 + 10 + 5 + 3000) + 6 + 1 + 2 + runs_rows
        big = [row["partition"] for row in stored if (row["value"] or b"").endswith(b"x" * 1000)]
        assert len(set(big)) >= 3, "the big body's keyless runs go to several partitions"
        runs = [row["partition"] for row in stored if (row["value"] or b"").startswith(b"r") and row["key"] is None]
        assert len(set(runs)) == PARTITIONS  # the keyless runs spread over every partition
    finally:
        for broker in (per_message, columnar):
            await broker.stop()


def test_results_render_byte_for_byte_as_the_per_message_path() -> None:
    rng = np.random.default_rng(11)
    edges = [0, 9, 10, 99, 100, 999_999_999_999_999_999, 10**18, 2**62, 2**63 - 1]
    for n in (1, 2, 7, 300):
        offsets = rng.choice(np.array(edges + [-1] * 3 + list(range(20)), np.int64), n)
        stamps = rng.choice(np.array([-1, 0, 1_700_000_000_000_000, 1_700_000_000_123_456], np.int64), n)
        results = BatchResults(rng.choice(np.array([-1, 0, 3, 10, 4095], np.int32), n), offsets,
                               rng.random(n) < 0.3, np.where(offsets < 0, -1, stamps))
        assert batch_results_json(results) == orjson.dumps({"results": _batch_results(_as_list(results))})
    # Results of one length each (the usual batch) are written as one matrix: partitions of one
    # digit count, offsets of one digit count, timestamps of one length, duplicates or not.
    for n, partitions, first, duplicate in ((1, [0], 0, False), (2, [0, 3], 10, True), (300, [0, 3, 7], 700, False),
                                            (5000, [10, 11, 42], 10**18, False), (64, [1, 2], 2**62, True)):
        offsets = np.arange(first, first + n, dtype=np.int64)
        stamps = rng.choice(np.array([1_700_000_000_000_001, 1_700_000_000_123_456], np.int64), n)
        results = BatchResults(rng.choice(np.array(partitions, np.int32), n), offsets, np.full(n, duplicate),
                               stamps)
        assert batch_results_json(results) == orjson.dumps({"results": _batch_results(_as_list(results))})


def test_shapes_outside_the_columnar_path_go_per_message() -> None:
    for message in (b'{"value": 5}', b'{"value": {"a": 1}}', b'{"value_b64": "AA=="}',
                    b'{"value": "a", "headers": {"h": "1"}}', b'{"value": "a", "producer_id": "p", "sequence": 1}',
                    b'{"key": 5, "value": "a"}', b'{"partition": 1.0, "value": "a"}',
                    b'{"partition": true, "value": "a"}', b'{"partition": -1, "value": "a"}',
                    b'{"partition": 1180591620717411303424, "value": "a"}', b'{"id": "", "value": "a"}',
                    b'{"id": "%s", "value": "a"}' % (b"x" * 257), b'{"key": "k"}', b'{"value": "a", "extra": 1}',
                    b'"a string"', b"[1]"):
        items = batch_items(JSON, b'{"messages": [{"value": "fine"}, %s]}' % message)
        assert columns_of(items) is None, message
    assert columns_of(batch_items(JSON, _json([{"value": "fine"}, {"value": None, "id": "x" * 256}]))) is not None


def test_http_batch_goes_columnar_and_is_stored(client: TestClient, orders: str, settings: Settings) -> None:
    body = _ndjson([{"key": f"k{i % 3}", "value": f"v{i}"} for i in range(30)])
    r = client.post(f"/v1/topics/{orders}/batch?ack=table", content=body, headers={"content-type": NDJSON})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [res["offset"] for res in results if res["partition"] == results[0]["partition"]] == \
        list(range(sum(1 for res in results if res["partition"] == results[0]["partition"])))
    wal = b"".join(p.read_bytes() for p in (settings.data_dir / "wal").glob("*.wal"))
    assert wal.count(CHUNK_MAGIC) >= 1, "the batch was not written as columnar chunks"
    p = results[0]["partition"]
    got = client.get(f"/v1/topics/{orders}/partitions/{p}/messages?offset=0&limit=100")
    assert got.status_code == 200, got.text
    assert [(m["key"], m["value"], m["format"]) for m in got.json()["messages"]] == \
        [(f"k{i % 3}", f"v{i}", "text") for i in range(30) if results[i]["partition"] == p]


async def test_chunks_are_replayed_once_after_a_crash_and_ids_stay_deduplicated(tmp_path: Path) -> None:
    items = batch_items(JSON, _json([{"id": f"m{i}", "key": f"k{i % 4}", "value": f"v{i}"} for i in range(50)]
                                    + [{"value": f"keyless {i}"} for i in range(10)]))
    broker = _broker(tmp_path, "data", flush_interval_ms=3_600_000)  # no flush before the crash
    await broker.start()
    await broker.create_topic(new_topic("t", PARTITIONS))
    batch = columns_of(items)
    assert batch is not None
    first = _as_list(await broker.local.produce_columns("t", batch, AckMode.WAL))
    # The crash: durable in the WAL, never flushed, no orderly stop.
    broker.committer.close()
    broker.flusher.close()
    for task in broker._tasks:
        await task
    broker.wal.close()

    again = _broker(tmp_path, "data")
    await again.start()  # recovery replays the chunks into Delta
    try:
        rows = pa.Table.from_pylist(_rows(again, "t"))
        assert rows.num_rows == 60
        assert sorted(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True)) == \
            sorted((r.partition, r.offset) for r in first)
        batch = columns_of(items)
        assert batch is not None
        retried = _as_list(await again.local.produce_columns("t", batch, AckMode.WAL))
        assert [(r.partition, r.offset) for r in retried[:50]] == [(r.partition, r.offset) for r in first[:50]]
        assert all(r.duplicate for r in retried[:50]) and not any(r.duplicate for r in retried[50:])
        await _settled(again)
        assert len(_rows(again, "t")) == 70
    finally:
        await again.stop()


def test_parse_batch_body_pauses_the_collector_only_while_it_parses() -> None:
    body = _json([{"value": f"v{i}", "key": f"k{i % 3}"} for i in range(50)])
    assert gc.isenabled()
    parsed = parse_batch_body(JSON, body)
    assert isinstance(parsed, ColumnarBatch) and parsed.rows == 50 and gc.isenabled()
    assert parsed.messages() == batch_items(JSON, body).messages()  # parsed again exactly, not kept
    per_message = parse_batch_body(JSON, _json([{"value": "v", "headers": {"h": "1"}}]))
    assert not isinstance(per_message, ColumnarBatch) and len(per_message.messages()) == 1 and gc.isenabled()
    with pytest.raises(LakebrokerError):
        parse_batch_body(JSON, b'{"messages": [')
    assert gc.isenabled()
    gc.disable()
    try:
        parse_batch_body(JSON, body)
        assert not gc.isenabled()  # a caller's own pause is left as it was
    finally:
        gc.enable()
