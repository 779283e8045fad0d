"""A Produce request's records (Kafka's magic-v2 record batches) as one columnar batch, decoded in
bulk: the only step per record is the walk over each record's length (records are laid end to end),
then every field of every record is read at once with numpy, and keys and values become Arrow
arrays over the request's bytes. kio's per-record reader builds a Python object per record and
costs 20-30x more.

A record: length (varint), attributes (i8), timestamp delta (varlong), offset delta (varint),
key length (varint, -1 null), key, value length, value, header count (varint), headers.
Varints are zigzag-encoded (Kafka's protobuf-style signed varints).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c
from isal import isal_zlib
from kio.serial.errors import DecodeError
from kio.serial.readers import read_signed_varint

from lakebroker.ingest_api.chunks import CHUNK_SCHEMA
from lakebroker.tables.errors import InvalidRequest, TooLarge

# baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8, crc u32, attributes i16,
# lastOffsetDelta i32, baseTimestamp i64, maxTimestamp i64, producerId i64, producerEpoch i16,
# baseSequence i32, recordCount i32
_HEADER = struct.Struct(">qiiBIhiqqqhii")
HEADER_BYTES = _HEADER.size  # 61
_CRC_FROM = 21  # the CRC covers attributes to the end
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_BINARY = pa.binary()


class CorruptBatch(InvalidRequest):
    """Kafka's CORRUPT_MESSAGE: a batch that does not add up, or whose CRC does not hold."""


class OldMagic(InvalidRequest):
    """Kafka's UNSUPPORTED_FOR_MESSAGE_FORMAT: a message set of magic 0 or 1 (before Kafka 0.11)."""


class UnsupportedCodec(InvalidRequest):
    """Kafka's UNSUPPORTED_COMPRESSION_TYPE."""


@dataclass(frozen=True, slots=True)
class Batch:
    """One record batch, checked (its header, its CRC) and decompressed: its records' bytes."""

    body: bytes
    count: int
    producer_id: int  # -1: not an idempotent producer
    producer_epoch: int
    base_sequence: int


def batches(records: bytes, max_bytes: int) -> list[Batch]:
    """Every batch in a partition's `records` field. `max_bytes` bounds what decompression may
    produce (a small gzip body can expand to anything)."""
    out: list[Batch] = []
    pos = 0
    while pos < len(records):
        if len(records) - pos < HEADER_BYTES:
            raise CorruptBatch("a record batch is cut short in its header")
        (_, length, _, magic, crc, attributes, _, _, _, producer_id, epoch, base_sequence,
         count) = _HEADER.unpack_from(records, pos)
        end = pos + 12 + length
        if records[pos + 16] in (0, 1):  # a message set's magic byte sits where a batch's does
            raise OldMagic(f"message sets of magic {records[pos + 16]} are not supported: send record batches "
                           "(magic 2, Kafka 0.11+)")
        if length < HEADER_BYTES - 12 or end > len(records):
            raise CorruptBatch(f"a record batch says it is {length} bytes long, which its request does not hold")
        if magic != 2:
            raise CorruptBatch(f"record batches of magic {magic} are not supported: send magic 2 (Kafka 0.11+)")
        view = memoryview(records)[pos:end]
        if crc32c(view[_CRC_FROM:]) != crc:
            raise CorruptBatch("a record batch's CRC32C does not match its bytes")
        if attributes & 0x10:
            raise InvalidRequest("transactional batches are not supported")
        if attributes & 0x20:
            raise InvalidRequest("control batches are not accepted from producers")
        if count <= 0:
            raise CorruptBatch("a record batch holds no record")
        body = _decompressed(bytes(view[HEADER_BYTES:]), attributes & 0x07, max_bytes)
        out.append(Batch(body, count, producer_id, epoch, base_sequence))
        pos = end
    return out


def decode(records: bytes, max_bytes: int) -> pa.Table:
    """A partition's `records` field as CHUNK_SCHEMA columns, one row per record in batch order."""
    return columns(batches(records, max_bytes))


def warm_up() -> None:
    """Decode one record: the first decode pays pyarrow's kernel set-up (about a second), which a
    listener pays at start rather than in its first client's produce."""
    one = bytes([0x10, 0, 0, 0, 0x02]) + b"k" + bytes([0x02]) + b"v" + bytes([0])
    columns([Batch(one, 1, -1, -1, -1)])


def _decompressed(body: bytes, codec: int, max_bytes: int) -> bytes:
    """A batch's records, decompressed into at most `max_bytes` (a small compressed batch can
    expand to anything: past the bound, decompression stops with MESSAGE_TOO_LARGE)."""
    if codec == 0:
        return body
    try:
        if codec == 1:
            inflater = isal_zlib.decompressobj(wbits=31)
            plain = inflater.decompress(body, max_bytes + 1)
            if len(plain) > max_bytes:
                raise TooLarge(f"a gzip record batch expands past {max_bytes} bytes")
            return plain
        if codec == 2:
            return _snappy(body, max_bytes)
        if codec in (3, 4):  # lz4 and zstd: a frame each, which may not say its size up front
            out = np.empty(max_bytes, np.uint8)
            try:
                used = (cramjam.lz4 if codec == 3 else cramjam.zstd).decompress_into(body, out)
            except cramjam.DecompressionError as exc:
                if "whole buffer" in str(exc):
                    raise TooLarge(f"a {CODECS[codec]} record batch expands past {max_bytes} bytes") from None
                raise
            return out[:used].tobytes()
    except cramjam.DecompressionError as exc:
        raise CorruptBatch(f"a {CODECS[codec]} record batch does not decompress: {exc}") from None
    raise UnsupportedCodec(f"compression type {codec} is not one of Kafka's (gzip 1, snappy 2, lz4 3, zstd 4)")


_XERIAL = b"\x82SNAPPY\x00"
_BLOCK = struct.Struct(">i")


def _snappy(body: bytes, max_bytes: int) -> bytes:
    """Snappy as Kafka's clients send it: Java's in xerial's framing (a header, then blocks each with
    its length), librdkafka's raw. Each block says its size before it is expanded."""
    if not body.startswith(_XERIAL):
        return _snappy_block(body, max_bytes)
    pos, blocks, total = 16, [], 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise CorruptBatch("a snappy record batch is cut short in a block's length")
        (size,) = _BLOCK.unpack_from(body, pos)
        if size < 0 or pos + 4 + size > len(body):
            raise CorruptBatch("a snappy block runs past its record batch")
        block = _snappy_block(body[pos + 4:pos + 4 + size], max_bytes - total)
        total += len(block)
        blocks.append(block)
        pos += 4 + size
    return b"".join(blocks)


def _snappy_block(block: bytes, max_bytes: int) -> bytes:
    if cramjam.snappy.decompress_raw_len(block) > max_bytes:
        raise TooLarge(f"a snappy record batch expands past {max_bytes} bytes")
    return bytes(cramjam.snappy.decompress_raw(block))


def _varints(b: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varint at each position, and its size, all at once. Each further byte is read
    only for the varints that go on: most are one byte or two."""
    if len(pos) and int(pos.max()) >= len(b):
        raise CorruptBatch("a record's varint runs past the end of its batch")
    byte = b[pos].astype(np.uint64)
    value = byte & np.uint64(0x7F)
    size = np.ones(len(pos), np.int64)
    going = np.flatnonzero(byte >= 0x80)
    for k in range(1, 10):
        if not len(going):
            break
        at = pos[going] + k
        if int(at.max()) >= len(b):
            raise CorruptBatch("a record's varint runs past the end of its batch")
        byte = b[at].astype(np.uint64)
        value[going] |= (byte & np.uint64(0x7F)) << np.uint64(7 * k)
        size[going] += 1
        going = going[byte >= 0x80]
    else:
        if len(going):
            raise CorruptBatch("a record holds a varint longer than 10 bytes")
    return (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64), size


def _starts(found: list[Batch]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The batches' records laid end to end, and where each record's fields begin (past its length)
    and where it ends in them: the walk over the length prefixes, the one step per record. A
    length of one or two bytes (a record under 8 KiB) is read inline; a longer one by kio."""
    body = found[0].body if len(found) == 1 else b"".join(b.body for b in found)
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    for batch in found:
        end = pos + len(batch.body)
        try:
            for _ in range(batch.count):
                first = body[pos]
                if first < 0x80:  # zigzag: the low bit is the sign
                    length, size = (first >> 1) ^ -(first & 1), 1
                elif (second := body[pos + 1]) < 0x80:
                    zigzag = (first & 0x7F) | (second << 7)
                    length, size = (zigzag >> 1) ^ -(zigzag & 1), 2
                else:
                    length, size = read_signed_varint(body, pos)
                if length < 0:
                    raise CorruptBatch(f"record {len(starts)} has a negative length")
                pos += size
                starts.append(pos)
                pos += length
                ends.append(pos)
        except (DecodeError, IndexError):
            raise CorruptBatch(f"a batch ends inside a record of its {batch.count}") from None
        if pos != end:
            raise CorruptBatch(f"a batch's {batch.count} records do not add up to its length")
    return body, np.array(starts, np.int64), np.array(ends, np.int64)


def columns(found: list[Batch]) -> pa.Table:
    """The records of `found` (one partition's batches, or several partitions') as CHUNK_SCHEMA
    columns, decoded in one pass. An idempotent producer's records carry its id and each one's
    sequence (the batch's base sequence + its index), which the broker's producer dedup
    (ingest_api/sequences.py) checks as for any producer."""
    body, starts, ends = _starts(found)
    count = len(starts)
    b = np.frombuffer(body, np.uint8)
    p = starts + 1  # past the attributes byte
    _, n = _varints(b, p)  # timestamp delta: the broker stamps its own log-append time
    p += n
    _, n = _varints(b, p)  # offset delta: the broker assigns the offsets
    p += n
    key_len, n = _varints(b, p)
    p += n
    key_at = p.copy()
    p += np.maximum(key_len, 0)
    value_len, n = _varints(b, p)
    p += n
    value_at = p.copy()
    p += np.maximum(value_len, 0)
    if (key_len < -1).any() or (value_len < -1).any() or (p >= ends).any():
        raise CorruptBatch("a record's key or value runs past its record")
    header_count, n = _varints(b, p)
    if (header_count < 0).any():
        raise CorruptBatch("a record has a negative header count")
    p += n
    if ((header_count == 0) & (p != ends)).any():
        raise CorruptBatch("a record holds bytes past its last field")
    buffer = pa.py_buffer(body)
    if (key_len < 0).all():  # keyless records, as most producers send: no key to build
        key_text = pa.nulls(count, pa.string())
    else:
        try:
            key_text = _binary(buffer, key_at, key_len, pa.string())
        except pa.ArrowInvalid:
            raise InvalidRequest("a record key is not UTF-8 text: lakebroker keys are strings") from None
    value = _binary(buffer, value_at, value_len)
    headers = _headers(body, p, ends, header_count) if header_count.any() else pa.nulls(count, _HEADERS)
    producer, sequence = _producers(found, count)
    return pa.Table.from_arrays(
        [key_text, value, pa.repeat("binary", count), headers, pa.nulls(count, pa.string()), producer, sequence],
        schema=CHUNK_SCHEMA)


def _producers(found: list[Batch], count: int) -> tuple[pa.Array, pa.Array]:
    """Each record's producer id (`kafka-<id>`) and sequence, null for a batch of a producer that
    is not idempotent."""
    idempotent = [b.producer_id >= 0 and b.base_sequence >= 0 for b in found]
    if not any(idempotent):
        return pa.nulls(count, pa.string()), pa.nulls(count, pa.int64())
    counts = np.array([b.count for b in found], np.int64)
    first = np.cumsum(counts) - counts  # each batch's first row
    sequence = np.arange(count, dtype=np.int64) + np.repeat(
        np.array([b.base_sequence for b in found], np.int64) - first, counts)
    if all(idempotent) and len({b.producer_id for b in found}) == 1:
        return pa.repeat(pa.scalar(f"kafka-{found[0].producer_id}"), count), pa.array(sequence)
    names = pa.array([f"kafka-{b.producer_id}" if ok else None for b, ok in zip(found, idempotent, strict=True)])
    batch_of = pa.array(np.repeat(np.arange(len(found)), counts))
    valid = np.repeat(np.array(idempotent), counts)
    return names.take(batch_of), pa.array(sequence, mask=~valid)


_HEADERS = CHUNK_SCHEMA.field("headers").type


def _headers(body: bytes, at: np.ndarray, ends: np.ndarray, counts: np.ndarray) -> pa.Array:
    """Each record's headers as the table's string map, in the record's order and with repeated
    names kept (a map column holds a list of entries). A record without headers has an empty map.
    Walked record by record: only the records that carry headers pay for it."""
    offsets = [0]
    names: list[str] = []
    values: list[str | None] = []
    try:
        for pos, end, count in zip(at.tolist(), ends.tolist(), counts.tolist(), strict=True):
            for _ in range(count):
                size, used = read_signed_varint(body, pos)
                pos += used
                if size < 0 or pos + size > end:
                    raise CorruptBatch("a record header's name runs past its record")
                names.append(body[pos:pos + size].decode())
                pos += size
                size, used = read_signed_varint(body, pos)
                pos += used
                if size < -1 or pos + max(size, 0) > end:
                    raise CorruptBatch("a record header's value runs past its record")
                values.append(None if size < 0 else body[pos:pos + size].decode())
                pos += max(size, 0)
            if pos != end:
                raise CorruptBatch("a record holds bytes past its last header")
            offsets.append(len(names))
    except UnicodeDecodeError:
        raise InvalidRequest("a record header's name or value is not UTF-8 text: lakebroker headers are "
                             "strings") from None
    except DecodeError:
        raise CorruptBatch("a record header's length runs past its record") from None
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(names, pa.string()),
                                   pa.array(values, pa.string()), type=_HEADERS)


def _binary(buffer: pa.Buffer, at: np.ndarray, length: np.ndarray, to: pa.DataType = _BINARY) -> pa.Array:
    """Arrow binary values (or `to`: strings, checked as UTF-8) at (`at`, `length`) in `buffer`;
    length -1 is null. Built as a binary view array over the request's bytes (16 bytes a value:
    its length, and up to 12 bytes inline or its first 4 and where the rest is), which Arrow's cast
    then copies to a binary array in C: a gather by numpy would index every byte."""
    n = len(at)
    present = length >= 0
    lengths = np.where(present, length, 0).astype(np.int32)
    views = np.zeros((n, 16), np.uint8)
    words = views.view(np.int32)  # (n, 4): length, then 12 bytes inline, or a prefix, buffer 0, offset
    words[:, 0] = lengths
    data = np.frombuffer(buffer, np.uint8)
    short = np.flatnonzero((lengths > 0) & (lengths <= 12))
    if len(short):  # inline, whole
        inline = np.arange(12)
        head = data[np.minimum(at[short, None] + inline, len(data) - 1)]
        head[inline[None, :] >= lengths[short, None]] = 0
        views[short, 4:16] = head
    long = np.flatnonzero(lengths > 12)
    if len(long):  # its first 4 bytes, and where it is
        views[long, 4:8] = data[at[long, None] + np.arange(4)]
        words[long, 3] = at[long]
    validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little").tobytes())
    return pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views.tobytes()), buffer],
                                 null_count=int((~present).sum())).cast(to)


# -- writing: the rows a Fetch answers with ---------------------------------------------------------
def encode(rows: pa.Table, leader_epoch: int) -> bytes:
    """`rows` (TOPIC_SCHEMA, sorted by offset, at least one) as one uncompressed magic-v2 batch.
    Each record's timestamp is its log-append time, as a CreateTime batch carries it; offsets may
    have holes (key compaction), which the offset deltas keep. Built in bulk: each field of every
    record as a binary column (the varints by numpy), then Arrow joins them record by record in C;
    only headers are written record by record, and only for the records that have some."""
    n = rows.num_rows
    offsets = rows.column("offset").to_numpy()
    stamps = pc.divide(rows.column("timestamp").cast(pa.int64()), 1000).to_numpy()  # µs → ms
    key = pc.cast(rows.column("key"), pa.binary()).combine_chunks()
    value = rows.column("value").combine_chunks()
    key_len = pc.fill_null(pc.binary_length(key), -1).to_numpy().astype(np.int64)
    value_len = pc.fill_null(pc.binary_length(value), -1).to_numpy().astype(np.int64)
    headers = _header_fields(rows.column("headers").combine_chunks())
    header_len = pc.binary_length(headers).to_numpy().astype(np.int64)
    base, base_ts = int(offsets[0]), int(stamps[0])
    ts_delta, ts_size = _varint_column(stamps - base_ts)
    offset_delta, offset_size = _varint_column(offsets - base)
    key_head, key_size = _varint_column(key_len)
    value_head, value_size = _varint_column(value_len)
    length = (1 + ts_size + offset_size + key_size + np.maximum(key_len, 0) + value_size + np.maximum(value_len, 0)
              + header_len)
    record_head, _ = _varint_column(length)
    empty = pa.scalar(b"", pa.binary())
    records = pc.binary_join_element_wise(
        record_head, pa.scalar(b"\0", pa.binary()), ts_delta, offset_delta, key_head, pc.fill_null(key, empty),
        value_head, pc.fill_null(value, empty), headers, empty)
    ends = np.frombuffer(records.buffers()[1], np.int32, n + 1, records.offset * 4)
    body: bytes = records.buffers()[2].to_pybytes()[int(ends[0]):int(ends[-1])]
    after_crc = _AFTER_CRC.pack(0, int(offsets[-1]) - base, base_ts, int(stamps.max()), -1, -1, -1, n) + body
    return _BEFORE_CRC.pack(base, len(after_crc) + 9, leader_epoch, 2, crc32c(after_crc)) + after_crc


def _varint_column(values: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Each value as a zigzag varint, as a binary column, and each one's size."""
    z = ((values.astype(np.int64) << 1) ^ (values.astype(np.int64) >> 63)).view(np.uint64)
    groups = np.empty((len(z), 10), np.uint8)
    size = np.ones(len(z), np.int64)
    for k in range(10):
        part = z >> np.uint64(7 * k)
        groups[:, k] = (part & np.uint64(0x7F)).astype(np.uint8)
        more = (part >> np.uint64(7)) != 0
        groups[:, k] |= more.astype(np.uint8) << 7
        size += more
        if not more.any():
            break
    used = np.arange(10)[None, :] < size[:, None]
    ends = np.zeros(len(z) + 1, np.int32)
    np.cumsum(size, out=ends[1:])
    column = pa.Array.from_buffers(pa.binary(), len(z), [None, pa.py_buffer(ends.tobytes()),
                                                          pa.py_buffer(groups[used].tobytes())])
    return column, size


def _header_fields(headers: pa.Array) -> pa.Array:
    """Each record's header count and headers, as bytes: one zero byte for a record with none."""
    if headers.null_count == len(headers) or not np.diff(headers.offsets.to_numpy()).any():
        n = len(headers)
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32).tobytes()),
                                                      pa.py_buffer(bytes(n))])
    out: list[bytes] = []
    for pairs in headers.to_pylist():
        field = bytearray(_zigzag(len(pairs) if pairs else 0))
        for name, text in pairs or ():
            _put_bytes(field, name.encode())
            _put_bytes(field, None if text is None else text.encode())
        out.append(bytes(field))
    return pa.array(out, pa.binary())


# baseOffset, batchLength, partitionLeaderEpoch, magic, crc | attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_BEFORE_CRC = struct.Struct(">qiiBI")
_AFTER_CRC = struct.Struct(">hiqqqhii")


def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _put_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out += _zigzag(-1)
    else:
        out += _zigzag(len(data))
        out += data
