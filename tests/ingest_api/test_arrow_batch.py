"""Arrow IPC stream batch bodies: the same answers and the same rows in Delta as the JSON batch
of the same messages, Arrow answers on request, and every bad body refused whole with a 4xx that
names what is wrong."""

from __future__ import annotations

import base64
import contextlib
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from lakebroker.ingest_api.app import create_app
from lakebroker.ingest_api.arrow_batch import ARROW_STREAM, RESULTS_SCHEMA, parse_arrow_batch, results_arrow
from lakebroker.ingest_api.body import InvalidShape
from lakebroker.ingest_api.chunks import BatchResults
from lakebroker.tables import delta
from lakebroker.tables.errors import TooLarge
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings

PARTITIONS = 4
HEADERS = pa.map_(pa.string(), pa.string())


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=7):  # several record batches in one stream
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _settings(tmp: Path, name: str, **extra: Any) -> Settings:
    return Settings(data_dir=tmp / name, flush_interval_ms=20, **extra)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[TestClient, TestClient]]:
    with TestClient(create_app(_settings(tmp_path, "json"))) as by_json, \
            TestClient(create_app(_settings(tmp_path, "arrow"))) as by_arrow:
        for c in (by_json, by_arrow):
            assert c.post("/v1/topics", json={"name": "t", "partitions": PARTITIONS}).status_code == 201
        yield by_json, by_arrow


# (key, value, headers, partition, id); a bytes value goes as value_b64 in JSON and binary in Arrow
MESSAGES: list[tuple[str | None, str | bytes | None, dict[str, str] | None, int | None, str | None]] = [
    *[(None, f"keyless {i} ünïcode", None, None, None) for i in range(30)],
    *[(f"user-{i % 5}", f"keyed {i}", None, None, None) for i in range(20)],
    *[(None, f"explicit {i}", None, i % PARTITIONS, None) for i in range(6)],
    ("k1", None, None, None, None),  # a tombstone
    (None, b"\x00\xffraw", {"trace": "abc", "ü": "é"}, None, None),
    ("k2", "with headers", {"a": "1"}, 2, "id-1"),
    *[(None, f"with id {i}", None, None, f"m{i % 4}") for i in range(9)],  # ids repeat: duplicates
    ("", "empty key", {}, None, None),
]


def _json_body(rows: list[Any]) -> bytes:
    out = []
    for key, value, headers, partition, mid in rows:
        m: dict[str, Any] = {"value": value} if not isinstance(value, bytes) else {
            "value_b64": base64.b64encode(value).decode()}
        for name, v in (("key", key), ("headers", headers), ("partition", partition), ("id", mid)):
            if v is not None:
                m[name] = v
        out.append(m)
    return orjson.dumps({"messages": out})


def _arrow_body(rows: list[Any], binary: bool) -> bytes:
    return _ipc(pa.table({
        "value": pa.array([v.encode() if isinstance(v, str) else v for _, v, *_ in rows], pa.binary()) if binary
        else pa.array([v for _, v, *_ in rows], pa.string()),
        "key": pa.array([r[0] for r in rows], pa.string()),
        "headers": pa.array([list(r[2].items()) if r[2] is not None else None for r in rows], HEADERS),
        "partition": pa.array([r[3] for r in rows], pa.int16()),
        "id": pa.array([r[4] for r in rows], pa.string()),
    }))


def _rows(settings: Settings, topic: str = "t") -> list[dict[str, Any]]:
    table = delta.open_table(Layout.of(settings).topic_table(topic))
    assert table is not None
    rows = table.to_pyarrow_table().sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()
    for row in rows:
        del row["timestamp"]
    return rows


def _without_time(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "timestamp"} for r in results]


def test_an_arrow_batch_answers_and_stores_as_its_json_batch(pair: tuple[TestClient, TestClient]) -> None:
    by_json, by_arrow = pair
    text = [r for r in MESSAGES if not isinstance(r[1], bytes)]
    raw = [(k, v.encode() if isinstance(v, str) else v, *rest) for k, v, *rest in MESSAGES]  # value_b64 in JSON
    for attempt in range(2):  # the second time every id is a duplicate; round-robin carries on
        for rows, binary in ((text, False), (raw, True)):
            j = by_json.post("/v1/topics/t/batch?ack=table", content=_json_body(rows),
                             headers={"content-type": "application/json"})
            a = by_arrow.post("/v1/topics/t/batch?ack=table", content=_arrow_body(rows, binary),
                              headers={"content-type": ARROW_STREAM})
            assert j.status_code == a.status_code == 200, (j.text, a.text)
            assert _without_time(a.json()["results"]) == _without_time(j.json()["results"]), (attempt, binary)
            assert any(r["duplicate"] for r in a.json()["results"]), "ids repeat: some are duplicates"
    stored = _rows(by_arrow.app.state.settings)  # type: ignore[attr-defined]
    assert stored == _rows(by_json.app.state.settings)  # type: ignore[attr-defined]
    assert {r["format"] for r in stored} == {"text", "binary", "json"}
    assert any(r["headers"] == [("trace", "abc"), ("ü", "é")] for r in stored)


@pytest.mark.parametrize("ack", ["wal", "none", "table"])
def test_arrow_results_on_request(pair: tuple[TestClient, TestClient], ack: str) -> None:
    _, client = pair
    body = _arrow_body(MESSAGES, binary=True)
    r = client.post(f"/v1/topics/t/batch?ack={ack}", content=body,
                    headers={"content-type": ARROW_STREAM, "accept": ARROW_STREAM})
    assert r.status_code == (202 if ack == "none" else 200), r.text
    assert r.headers["content-type"] == ARROW_STREAM
    got = pa.ipc.open_stream(r.content).read_all()
    got.validate(full=True)
    assert got.schema == RESULTS_SCHEMA and got.num_rows == len(MESSAGES)
    rows = got.to_pylist()
    if ack == "none":
        assert all(row["offset"] is None and row["timestamp"] is None for row in rows if not row["duplicate"])
        return
    # the same results as the JSON rendering of a second, identical batch: every id a duplicate there
    again = client.post(f"/v1/topics/t/batch?ack={ack}", content=body, headers={"content-type": ARROW_STREAM}).json()
    for mine, theirs in zip(rows, again["results"], strict=True):
        if theirs["duplicate"]:
            assert (mine["partition"], mine["offset"]) == (theirs["partition"], theirs["offset"])
    by_partition: dict[int, list[int]] = {}
    for row in rows:
        if not row["duplicate"]:
            by_partition.setdefault(row["partition"], []).append(row["offset"])
    assert all(offsets == list(range(len(offsets))) for offsets in by_partition.values()), "dense from 0"


def test_the_results_stream_is_what_an_arrow_writer_writes() -> None:
    """results_arrow assembles the stream itself: it must be byte for byte pyarrow's own, nulls
    (not known yet) and duplicates included."""
    n = 10
    results = BatchResults(np.arange(n, dtype=np.int32) % 3, np.arange(100, 100 + n, dtype=np.int64),
                           np.arange(n) % 4 == 1, np.full(n, 1_700_000_000_000_000, np.int64))
    for unknown in ([], [2, 7]):
        results.partition[unknown] = -1
        results.offset[unknown] = -1
        results.timestamp_us[unknown] = -1
        table = pa.table({
            "partition": pa.array(results.partition, mask=results.partition < 0),
            "offset": pa.array(results.offset, mask=results.offset < 0),
            "duplicate": pa.array(results.duplicate),
            "timestamp": pa.array(results.timestamp_us, mask=results.timestamp_us < 0).view(
                RESULTS_SCHEMA.field("timestamp").type),
        }, schema=RESULTS_SCHEMA)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, RESULTS_SCHEMA) as writer:
            writer.write_table(table)
        assert results_arrow(results) == sink.getvalue().to_pybytes(), unknown
    # A batch stored whole (`complete`: nothing unknown, no duplicate) is written without a look.
    whole = BatchResults(np.arange(n, dtype=np.int32) % 3, np.arange(100, 100 + n, dtype=np.int64),
                         np.zeros(n, np.bool_), np.full(n, 1_700_000_000_000_000, np.int64), complete=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RESULTS_SCHEMA) as writer:
        stamps = pa.array(whole.timestamp_us).view(RESULTS_SCHEMA.field("timestamp").type)
        writer.write_table(pa.table({"partition": whole.partition, "offset": whole.offset, "duplicate": whole.duplicate,
                                     "timestamp": stamps}, schema=RESULTS_SCHEMA))
    assert results_arrow(whole) == sink.getvalue().to_pybytes()


def _stream_of(**columns: pa.Array) -> bytes:
    return _ipc(pa.table(columns))


BAD: dict[str, tuple[bytes, int, str]] = {
    "not arrow": (b"this is not an Arrow stream at all", 400, "malformed Arrow IPC stream"),
    "truncated": (_stream_of(value=pa.array(["a"] * 50))[:-40], 400, "malformed Arrow IPC stream"),
    "no rows": (_ipc(pa.table({"value": pa.array([], pa.string())})), 422, "1 to 100000 rows"),
    "no value column": (_stream_of(key=pa.array(["k"])), 422, "the value column is required"),
    "unknown column": (_stream_of(value=pa.array(["v"]), colour=pa.array(["red"])), 422, "unknown columns colour"),
    "value of a wrong type": (_stream_of(value=pa.array([1, 2])), 422,
                              "value column must be binary or string, not int64"),
    "key of a wrong type": (_stream_of(value=pa.array(["v"]), key=pa.array([1.5])), 422, "key column must be a string"),
    "key not UTF-8": (_stream_of(value=pa.array(["v"]), key=pa.array([b"\xff"])), 422, "not UTF-8"),
    "keyless tombstone": (_stream_of(value=pa.array(["a", None]), key=pa.array(["k", None])), 422,
                          "invalid message 1: a null value is a tombstone, which needs a key"),
    "null header value": (_stream_of(value=pa.array(["a", "b"]), headers=pa.array([None, [("h", None)]], HEADERS)),
                          422, "invalid message 1: a header's value is null"),
    "headers of a wrong type": (_stream_of(value=pa.array(["a"]), headers=pa.array([["x"]])), 422,
                                "headers column must be a map of string to string"),
    "partition out of range": (_stream_of(value=pa.array(["a", "b"]), partition=pa.array([0, PARTITIONS])), 400,
                               f"partition {PARTITIONS} is out of range"),
    "negative partition": (_stream_of(value=pa.array(["a", "b"]), partition=pa.array([0, -1], pa.int8())), 422,
                           "invalid message 1: partition must be between"),
    "partition not an integer": (_stream_of(value=pa.array(["a"]), partition=pa.array(["1"])), 422,
                                 "partition column must be of an integer type"),
    "empty id": (_stream_of(value=pa.array(["a", "b"]), id=pa.array(["x", ""])), 422,
                 "invalid message 1: id must be 1 to 256 characters"),
    "message over the topic's limit": (_stream_of(value=pa.array(["a", "x" * 2_000_000])), 413, "message 1 is"),
    "dictionary of views": (_stream_of(value=pa.DictionaryArray.from_arrays(pa.array([0], pa.int8()),
                                                                           pa.array(["a"], pa.string_view()))),
                            422, "only strings, bytes and integers may be dictionary-encoded, not string_view"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_arrow_body_is_refused_and_stores_nothing(pair: tuple[TestClient, TestClient], name: str) -> None:
    _, client = pair
    body, status, text = BAD[name]
    r = client.post("/v1/topics/t/batch", content=body, headers={"content-type": ARROW_STREAM})
    assert r.status_code == status, r.text
    assert text in r.json()["error"]["message"], r.text
    _nothing_stored(client)


def test_an_arrow_body_over_the_request_limit_is_refused(tmp_path: Path) -> None:
    with TestClient(create_app(_settings(tmp_path, "small", max_request_bytes=64 * 1024))) as client:
        assert client.post("/v1/topics", json={"name": "t", "partitions": PARTITIONS}).status_code == 201
        r = client.post("/v1/topics/t/batch", content=_stream_of(value=pa.array(["x" * 1000] * 100)),
                        headers={"content-type": ARROW_STREAM})
        assert r.status_code == 413, r.text
        _nothing_stored(client)


def _nothing_stored(client: TestClient) -> None:
    """One message to each partition lands at offset 0: nothing of the refused request took one."""
    for p in range(PARTITIONS):
        r = client.post("/v1/topics/t/messages?ack=table", json={"value": "after", "partition": p})
        assert r.status_code == 200 and r.json()["offset"] == 0, r.text


def _compressed(table: pa.Table, codec: str) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        for batch in table.to_batches(max_chunksize=50):
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_compressed_arrow_body_is_read_within_the_request_limit(tmp_path: Path, codec: str) -> None:
    """A compressed stream is accepted while what it decodes to fits the request limit; one that
    would decode past it (a few MB of zeros to hundreds of MB) is refused before it is decoded."""
    with TestClient(create_app(_settings(tmp_path, "small", max_request_bytes=1024 * 1024))) as client:
        assert client.post("/v1/topics", json={"name": "t", "partitions": PARTITIONS}).status_code == 201
        small = pa.table({"value": pa.array([f"v{i}" * 20 for i in range(200)]),
                          "partition": pa.array([i % PARTITIONS for i in range(200)], pa.int32())})
        r = client.post("/v1/topics/t/batch?ack=table", content=_compressed(small, codec),
                        headers={"content-type": ARROW_STREAM})
        assert r.status_code == 200, r.text[:500]
        assert [m["offset"] for m in r.json()["results"][:PARTITIONS]] == [0] * PARTITIONS

        bomb = pa.table({"value": pa.array([b"\0" * 100_000] * 400, pa.binary())})  # 40 MB decoded
        body = _compressed(bomb, codec)
        assert len(body) < 1024 * 1024
        r = client.post("/v1/topics/t/batch", content=body, headers={"content-type": ARROW_STREAM})
        assert r.status_code == 413, r.text[:500]
        assert "decodes to" in r.json()["error"]["message"], r.text[:500]
        after = client.post("/v1/topics/t/messages?ack=table", json={"value": "after", "partition": 0})
        assert after.json()["offset"] == 50, "nothing of the refused body took an offset"


def _one_batch(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _dictionary(entries: pa.Array, rows: int) -> pa.DictionaryArray:
    """`rows` rows of int8 indices cycling over `entries`."""
    indices = pa.array(np.arange(rows) % len(entries), pa.int8())
    return pa.DictionaryArray.from_arrays(indices, entries)


# A body of about 100 KB or 1 MB whose one dictionary entry, repeated by 100,000 one-byte indices,
# decodes to 100 MB, or 100 GiB (as large_binary: past what a binary's 32-bit offsets can hold).
HOSTILE = {"1000-byte string": pa.array(["x" * 1000]),
           "1 MiB large_binary": pa.array([b"k" * 2**20], pa.large_binary())}


@contextlib.contextmanager
def _address_space(headroom: int) -> Iterator[None]:
    """The process may map only `headroom` more bytes: were a hostile body decoded, the test fails
    with a MemoryError instead of taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom if hard == resource.RLIM_INFINITY
                                            else min(hard, mapped + headroom), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("entry", list(HOSTILE))
@pytest.mark.parametrize("column", ["value", "key"])
def test_a_dictionary_that_decodes_past_the_limit_is_refused_before_it_is_decoded(column: str, entry: str) -> None:
    rows = 100_000
    other = "key" if column == "value" else "value"
    body = _one_batch(pa.table({column: _dictionary(HOSTILE[entry], rows), other: _dictionary(pa.array(["v"]), rows)}))
    assert len(body) < 2**20 + 300_000  # the entry, and 100 KB of indices for each column
    limit = 32 * 1024 * 1024
    with _address_space(2 * 1024**3), pytest.raises(TooLarge, match=f"over the request limit of {limit}"):
        parse_arrow_batch(body, limit)


def test_a_hostile_dictionary_body_is_a_413(pair: tuple[TestClient, TestClient]) -> None:
    _, client = pair
    body = _one_batch(pa.table({"value": _dictionary(HOSTILE["1 MiB large_binary"], 100_000)}))
    with _address_space(2 * 1024**3):
        r = client.post("/v1/topics/t/batch", content=body, headers={"content-type": ARROW_STREAM})
    assert r.status_code == 413, r.text[:500]
    assert "over the request limit of" in r.json()["error"]["message"], r.text[:500]
    _nothing_stored(client)


def test_dictionary_columns_within_the_limit_store_what_their_plain_columns_do(
        pair: tuple[TestClient, TestClient]) -> None:
    """Categories as pandas writes them (int8 indices), in two chunks with a dictionary each (two
    frames concatenated): 200 entries in all, more than one int8 dictionary can number."""
    plain_client, dictionary_client = pair
    rows = 300
    plain = pa.table({
        "value": pa.array([None if i % 50 == 7 else f"{'vw'[i * 2 // rows]}{i % 100} ü" for i in range(rows)]),
        "key": pa.array([f"user-{i % 4}" if i % 5 else None for i in range(rows)], pa.large_binary()),
        "partition": pa.array([None if i % 3 else i % PARTITIONS for i in range(rows)], pa.int16()),
    })

    def categories(column: pa.ChunkedArray) -> pa.ChunkedArray:
        halves = [column.slice(0, rows // 2).combine_chunks(), column.slice(rows // 2).combine_chunks()]
        encoded = [half.dictionary_encode() for half in halves]
        return pa.chunked_array([pa.DictionaryArray.from_arrays(e.indices.cast(pa.int8()), e.dictionary)
                                 for e in encoded])

    encoded = pa.table({name: categories(plain.column(name)) for name in plain.column_names})
    assert len(encoded.column("value").chunk(0).dictionary) + len(encoded.column("value").chunk(1).dictionary) > 128
    for client, table in ((plain_client, plain), (dictionary_client, encoded)):
        r = client.post("/v1/topics/t/batch?ack=table", content=_one_batch(table),
                        headers={"content-type": ARROW_STREAM})
        assert r.status_code == 200, r.text[:500]
    stored = _rows(dictionary_client.app.state.settings)  # type: ignore[attr-defined]
    assert len(stored) == rows
    assert stored == _rows(plain_client.app.state.settings)  # type: ignore[attr-defined]


def test_a_dictionary_shared_by_many_batches_counts_with_each() -> None:
    """Validation reads a chunk's dictionary with each chunk: 1,024 one-row batches sharing 100,000
    entries (a 3 MB body) held the event loop for seconds."""
    entries = pa.array([f"entry {i}" for i in range(100_000)])
    schema = pa.schema([("value", pa.dictionary(pa.int32(), pa.string()))])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for i in range(1024):
            writer.write_batch(pa.record_batch([pa.DictionaryArray.from_arrays(pa.array([i], pa.int32()), entries)],
                                               schema=schema))
    with pytest.raises(TooLarge, match="each batch with its dictionaries, over the request limit of 33554432"):
        parse_arrow_batch(sink.getvalue().to_pybytes(), 32 * 1024 * 1024)


def _batches(count: int, then: bytes = b"") -> bytes:
    """A stream of `count` record batches, all empty but the last (one row), then `then`."""
    schema = pa.schema([("value", pa.string())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        empty = pa.record_batch([pa.array([], pa.string())], schema=schema)
        for _ in range(count - 1):
            writer.write_batch(empty)
        writer.write_batch(pa.record_batch([pa.array(["x"])], schema=schema))
    return bytes(sink.getvalue().to_pybytes()) + then


def test_a_body_of_too_many_record_batches_is_refused() -> None:
    """50,001 batches (8 MB) held the event loop most of a second; the bound is counted as the
    stream is read, so what follows the batch past it is never read."""
    with pytest.raises(InvalidShape, match="at most 1024 record batches"):
        parse_arrow_batch(_batches(50_001), 32 * 1024 * 1024)
    with pytest.raises(InvalidShape, match="at most 1024 record batches"):
        parse_arrow_batch(_batches(1025, then=b"not read" * 1000), 32 * 1024 * 1024)
    assert parse_arrow_batch(_batches(1024), 32 * 1024 * 1024).columns.num_rows == 1


def test_a_body_of_too_many_dictionary_batches_is_refused() -> None:
    """A dictionary replaced with each batch: 513 batches of two such columns are 1,026 dictionaries."""
    schema = pa.schema([(name, pa.dictionary(pa.int32(), pa.string())) for name in ("value", "key")])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for i in range(513):
            writer.write_batch(pa.record_batch([pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()),
                                                                               pa.array([f"{i}"]))] * 2, schema=schema))
    with pytest.raises(InvalidShape, match="at most 1024 dictionary batches"):
        parse_arrow_batch(sink.getvalue().to_pybytes(), 32 * 1024 * 1024)
