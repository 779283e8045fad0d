"""A columnar run of messages for one partition, and its checksummed WAL frame.

A batch produced through the columnar path becomes one `Chunk` per partition it touches: its
messages' columns as an Arrow table, in request order, and the first offset of a dense run
that the group committer assigns. The WAL stores the chunk as one frame; the flusher appends
its columns with partition, offset and timestamp added as whole arrays. No step takes a
Python object per message.

Frame layout (little-endian), beside the per-record frame of records.py:

    magic "\\xd3LBc" | u32 body_length | u32 crc32(body_length || body) | body

    body = topic_id[16] partition:u32 offset:u64 timestamp_us:i64 rows:u32
           topic as i32 length + bytes, then one Arrow IPC stream of CHUNK_SCHEMA
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.ingest_api.ipc_frames import stream_pieces
from lakebroker.ingest_api.records import CHUNK_MAGIC, MAX_FRAME_BYTES, RECORD_OVERHEAD, seal_parts
from lakebroker.tables.schemas import TOPIC_SCHEMA

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from lakebroker.ingest_api.messages import NewMessage

# Every topic column but the three the WAL frame and the committer own.
CHUNK_SCHEMA = pa.schema([f for f in TOPIC_SCHEMA if f.name not in ("partition", "offset", "timestamp")])
CHUNK_BYTES = MAX_FRAME_BYTES // 4  # a chunk's messages add up to about this at most, so its frame fits
_FIXED = struct.Struct("<16sIQqI")
_LEN = struct.Struct("<i")
_TIMESTAMP = TOPIC_SCHEMA.field("timestamp").type
_SCHEMA_MESSAGE = CHUNK_SCHEMA.serialize().to_pybytes()


class ChunkFrameError(ValueError):
    """A frame whose checksum holds but whose contents do not add up: never replayed."""


@dataclass(slots=True)
class ColumnarBatch:
    """A batch body as columns, before partitioning (ingest_api/columnar.py builds it)."""

    columns: pa.Table  # CHUNK_SCHEMA, one row per message in request order
    partitions: pa.Array  # int64: each message's explicit partition, or null
    messages: Callable[[], list[NewMessage]]  # the same batch for the per-message path
    # Set once its messages are queued for the WAL (their offsets' order is then fixed), or none is
    # to be: a door that pipelines a connection's requests hands the core the next one then.
    queued: asyncio.Event | None = None
    # Kafka's idempotent producer: each producer's sequences in a partition follow on with no gap,
    # so a run that starts past the next one is refused (sequences.OutOfOrderSequence), not stored.
    consecutive: bool = False

    @property
    def rows(self) -> int:
        return int(self.columns.num_rows)

    @classmethod
    def of(cls, columns: pa.Table, partitions: pa.Array, queued: asyncio.Event | None = None, *,
           consecutive: bool = False) -> ColumnarBatch:
        """`columns` (CHUNK_SCHEMA) with each message's explicit partition (or null)."""

        def messages() -> list[NewMessage]:
            from lakebroker.ingest_api.messages import NewMessage

            rows = zip(columns.column("key").to_pylist(), columns.column("value").to_pylist(),
                       columns.column("format").to_pylist(), columns.column("headers").to_pylist(),
                       columns.column("message_id").to_pylist(), columns.column("producer_id").to_pylist(),
                       columns.column("sequence").to_pylist(), partitions.to_pylist(), strict=True)
            return [NewMessage(value=value, format=fmt, key=key, headers=dict(headers) if headers else None,
                               partition=partition, message_id=mid, producer_id=producer, sequence=sequence)
                    for key, value, fmt, headers, mid, producer, sequence, partition in rows]

        return cls(columns, partitions, messages, queued, consecutive)


@dataclass(slots=True)
class BatchResults:
    """Per-message results of a columnar batch, in request order, as arrays."""

    partition: np.ndarray  # -1: a duplicate whose original is not yet placed (ack=none)
    offset: np.ndarray  # -1: not yet known (ack=none)
    duplicate: np.ndarray
    timestamp_us: np.ndarray  # -1 where the offset is not known
    complete: bool = False  # known without a look: every message stored anew, every answer known


@dataclass(slots=True)
class Chunk:
    topic: str
    topic_id: bytes
    partition: int
    offset: int  # the first offset; assigned by the group committer, -1 before
    timestamp_us: int
    columns: pa.Table  # CHUNK_SCHEMA, one row per message in request order
    size: int  # bytes for backlog and batch-size accounting, as Record.size counts them
    claim: int = 0  # GroupCommitter.claims when its offsets were given

    @property
    def rows(self) -> int:
        return int(self.columns.num_rows)

    @property
    def end(self) -> int:
        """The offset after the last message."""
        return self.offset + self.rows

    def to_arrow(self, skip: int = 0) -> pa.Table:
        """The topic-table rows from the `skip`-th message on: TOPIC_SCHEMA, in offset order."""
        columns = self.columns.slice(skip)
        n = columns.num_rows
        first = self.offset + skip
        fixed = [
            pa.array(np.full(n, self.partition, np.int32)),
            pa.array(np.arange(first, first + n, dtype=np.int64)),
            pa.array(np.full(n, self.timestamp_us, np.int64)).view(_TIMESTAMP),
        ]
        return pa.Table.from_arrays(fixed + list(columns.columns), schema=TOPIC_SCHEMA)


def chunks_to_arrow(pieces: list[tuple[Chunk, int]]) -> pa.Table:
    """Many chunks' topic-table rows at once, each from its `skip`-th message on: the columns
    concatenated without copying, partition, offset and timestamp built as three arrays."""
    counts = np.array([c.rows - skip for c, skip in pieces], np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    firsts = np.array([c.offset + skip for c, skip in pieces], np.int64)
    total = int(counts.sum())
    fixed = [
        pa.array(np.repeat(np.array([c.partition for c, _ in pieces], np.int32), counts)),
        pa.array(np.arange(total, dtype=np.int64) + np.repeat(firsts - starts, counts)),
        pa.array(np.repeat(np.array([c.timestamp_us for c, _ in pieces], np.int64), counts)).view(_TIMESTAMP),
    ]
    columns = pa.concat_tables([c.columns.slice(skip) for c, skip in pieces])
    return pa.Table.from_arrays(fixed + list(columns.columns), schema=TOPIC_SCHEMA)


def encode_chunk(chunk: Chunk) -> bytes:
    return b"".join(chunk_frame(chunk))


def chunk_frame(chunk: Chunk) -> list[Buffer]:
    """A chunk's WAL frame in pieces: its head, then the Arrow IPC stream of its columns. The WAL
    thread encodes it: one serialize() per batch gives up the GIL once, where a stream writer gives
    it up several times, and each time the thread takes it back the event loop may be left waiting."""
    topic = chunk.topic.encode()
    head = _FIXED.pack(chunk.topic_id, chunk.partition, chunk.offset, chunk.timestamp_us, chunk.rows)
    return seal_parts(CHUNK_MAGIC, [b"".join((head, _LEN.pack(len(topic)), topic)),
                                    *stream_pieces(_SCHEMA_MESSAGE, chunk.columns.to_batches())])


def decode_chunk(body: bytes) -> Chunk:
    topic_id, partition, offset, ts, rows = _FIXED.unpack_from(body, 0)
    pos = _FIXED.size
    (n,) = _LEN.unpack_from(body, pos)
    pos += _LEN.size
    topic = body[pos : pos + n].decode()
    try:
        columns = pa.ipc.open_stream(pa.py_buffer(body[pos + n :])).read_all()
    except pa.ArrowInvalid as exc:
        raise ChunkFrameError(f"chunk frame of topic {topic!r}: unreadable Arrow stream ({exc})") from None
    if columns.schema != CHUNK_SCHEMA or columns.num_rows != rows:
        raise ChunkFrameError(f"chunk frame of topic {topic!r}: {columns.num_rows} rows of an unexpected shape")
    return Chunk(topic, topic_id, partition, offset, ts, columns, chunk_bytes(columns))


def chunk_bytes(columns: pa.Table) -> int:
    """What Record.size would count over these messages: RECORD_OVERHEAD per message plus key,
    value and headers."""
    size = RECORD_OVERHEAD * int(columns.num_rows)
    for name in ("key", "value", "headers"):
        column = columns.column(name)
        if column.null_count < len(column):
            size += _data_bytes(column)
    return size


def _data_bytes(column: pa.ChunkedArray) -> int:
    total = 0
    for array in column.chunks:
        if pa.types.is_map(array.type):
            total += _data_bytes(pa.chunked_array([array.keys])) + _data_bytes(pa.chunked_array([array.items]))
        else:
            offsets = _offsets(array)
            total += int(offsets[-1] - offsets[0])
    return total


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array: its only chunk as it is (`combine_chunks` copies even that one)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def message_sizes(columns: pa.Table) -> np.ndarray:
    """Each message's size as records.message_bytes measures it: key and value bytes, and its
    headers' names and values."""
    parts = [_lengths(one_array(column)) for name in ("key", "value")
             if (column := columns.column(name)).null_count < len(column)]
    headers = columns.column("headers")
    if headers.null_count < len(headers):
        parts.append(_header_bytes(one_array(headers)))
    if not parts:
        return np.zeros(columns.num_rows, np.int64)
    size = parts[0]  # each part a new array: summed in place
    for more in parts[1:]:
        size += more
    return size


def _lengths(array: pa.Array) -> np.ndarray:
    """Each value's length in bytes (0 for null) of a string or binary array, from its offsets."""
    offsets = _offsets(array)
    lengths: np.ndarray = np.subtract(offsets[1:], offsets[:-1], dtype=np.int64)
    if array.null_count:  # a null slot may still span bytes (the format allows it)
        lengths[array.is_null().to_numpy(zero_copy_only=False)] = 0
    return lengths


def _offsets(array: pa.Array) -> np.ndarray:
    """A string or binary array's value offsets (32-bit), its slice's only."""
    return np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4)


def _header_bytes(headers: pa.MapArray) -> np.ndarray:
    """Each row's header names and values, in bytes (0 for a row without headers)."""
    entry = pc.binary_length(headers.keys).to_numpy() + pc.fill_null(pc.binary_length(headers.items), 0).to_numpy()
    totals = np.concatenate(([0], np.cumsum(entry, dtype=np.int64)))
    offsets = headers.offsets.to_numpy()
    rows = totals[offsets[1:]] - totals[offsets[:-1]]
    return np.where(headers.is_null().to_numpy(zero_copy_only=False), 0, rows)


def spans_by_bytes(sizes: np.ndarray, start: int, end: int,
                   limit: int = CHUNK_BYTES) -> list[tuple[int, int, int]]:
    """The consecutive messages [start, end) of `sizes` cut into runs of about `limit` bytes at
    most, each one WAL frame and holding at least one message: (start, end, the bytes Record.size
    counts for them) each."""
    weights = sizes[start:end] + RECORD_OVERHEAD
    total = int(weights.sum())
    if total <= limit:
        return [(start, end, total)]
    summed = np.cumsum(weights)
    cuts = [0, *(np.flatnonzero(np.diff(summed // limit)) + 1).tolist(), end - start]
    before = [0, *summed[np.array(cuts[1:]) - 1].tolist()]  # the bytes before each cut
    return [(start + a, start + b, after - upto) for (a, b), (upto, after)
            in zip(itertools.pairwise(cuts), itertools.pairwise(before), strict=True) if b > a]


def split_by_bytes(rows: np.ndarray, sizes: np.ndarray, limit: int = CHUNK_BYTES) -> list[np.ndarray]:
    """`rows` (one partition's messages, with their sizes) cut as `spans_by_bytes` cuts them."""
    return [rows[a:b] for a, b, _ in spans_by_bytes(sizes, 0, len(sizes), limit)]
