"""The id a WAL message takes when it leaves its node (ingest_api/hand_off.py), and the WAL letting
handed messages go at once: the pieces tests/ingest_api/test_hand_off.py runs end to end."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from lakebroker.ingest_api.chunks import CHUNK_SCHEMA, Chunk, chunk_bytes, chunk_frame, decode_chunk
from lakebroker.ingest_api.dedup import dedup_id
from lakebroker.ingest_api.hand_off import identified
from lakebroker.ingest_api.records import FRAME_HEADER, Record, encode
from lakebroker.ingest_api.wal import Wal, delete_segments

TOPIC_ID = bytes(range(16))


def _record(offset: int, message_id: str | None = None, producer_id: str | None = None,
            sequence: int | None = None) -> Record:
    return Record("t", TOPIC_ID, 2, offset, 1_700_000_000_000_000, None, b"v", "text", None, message_id,
                  producer_id, sequence)


def test_a_record_without_an_id_gets_its_nodes_producer_id_and_its_offset_and_others_keep_theirs() -> None:
    bare = _record(41)
    given = identified(bare, "n1")
    assert isinstance(given, Record)
    assert (given.message_id, given.producer_id, given.sequence) == (None, "lakebroker-node:n1:2", 41)
    assert identified(bare, "n1") == given, "the same WAL item gets the same id each time it leaves"
    assert identified(_record(42), "n1") != given and identified(bare, "n2") != given
    with_id = _record(41, message_id="m-1")
    with_sequence = _record(41, producer_id="app", sequence=7)
    assert identified(with_id, "n1") is with_id and identified(with_sequence, "n1") is with_sequence


def test_a_chunks_rows_without_ids_get_one_each_by_offset_and_the_chunk_survives_its_frame() -> None:
    columns = pa.Table.from_pylist(
        [{"key": None, "value": b"a", "format": "text", "headers": None, "message_id": "m", "producer_id": None,
          "sequence": None},
         {"key": None, "value": b"b", "format": "text", "headers": None, "message_id": None, "producer_id": None,
          "sequence": None},
         {"key": None, "value": b"c", "format": "text", "headers": None, "message_id": None, "producer_id": "app",
          "sequence": 7},
         {"key": None, "value": b"d", "format": "text", "headers": None, "message_id": None, "producer_id": None,
          "sequence": None}], schema=CHUNK_SCHEMA)
    chunk = Chunk("t", TOPIC_ID, 3, 100, 1_700_000_000_000_000, columns, chunk_bytes(columns))
    given = identified(chunk, "n1")
    assert isinstance(given, Chunk)
    rows = given.columns.to_pylist()
    assert [dedup_id(r["message_id"], r["producer_id"], r["sequence"], chunk.partition) for r in rows] == [
        "m:m", "p:lakebroker-node:n1:3:3:101", "p:app:3:7", "p:lakebroker-node:n1:3:3:103"]
    assert [r["value"] for r in rows] == [b"a", b"b", b"c", b"d"]
    frame = b"".join(bytes(b) for b in chunk_frame(given))
    assert decode_chunk(frame[FRAME_HEADER.size:]).columns.equals(given.columns), "the WAL keeps the ids"
    whole = identified(given, "n1")
    assert whole is given, "a chunk whose every row has an id is handed on as it is"


def test_sealing_lets_the_wal_release_handed_messages_from_its_active_segment(tmp_path: Path) -> None:
    wal = Wal(tmp_path, segment_bytes=1 << 20, fsync=True)
    wal.recover()
    mine, theirs = (TOPIC_ID, 0), (TOPIC_ID, 1)
    held = [Record("t", TOPIC_ID, 1, o, 1, None, b"v", "text", None, None, None, None) for o in range(3)]
    wal.append([encode(r) for r in held], held)
    wal.seal_if_holding(mine)  # the active segment holds nothing of partition 0: left as it is
    assert wal.segment_count() == 1
    wal.seal_if_holding(theirs)
    assert wal.segment_count() == 2, "sealed behind a new active segment"
    released = wal.release(lambda key: 3 if key == theirs else 0)
    assert len(released) == 1, "all three handed: the segment goes"
    delete_segments(released)
    wal.close()
    assert Wal(tmp_path, segment_bytes=1 << 20, fsync=True).recover().records == []
