"""A message as the WAL and the flusher see it, and its checksummed on-disk frame.

Frame layout (little-endian):

    magic "\\xd3LBf" | u32 body_length | u32 crc32(body_length || body) | body

    body = topic_id[16] partition:u32 offset:u64 timestamp_us:i64 format:u8 sequence:i64
           then topic, key, value, headers(JSON), message_id, producer_id,
           each as i32 length (-1 for null) followed by the bytes.

A batch's columnar chunks use the same header with their own magic (chunks.py).

The CRC covers the length too, so a damaged length is caught before it is trusted. The magic
lets recovery resynchronise after damage by searching for it, instead of checksumming from
every byte position; a body is never longer than MAX_FRAME_BYTES, which bounds each try.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
from isal.isal_zlib import crc32  # zlib's CRC-32, an order of magnitude faster over large frames

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

FORMATS = ("json", "text", "binary")
_FORMAT_CODE = {name: i for i, name in enumerate(FORMATS)}

FRAME_MAGIC = b"\xd3LBf"  # non-ASCII first byte: rare in text and JSON payloads
CHUNK_MAGIC = b"\xd3LBc"  # a columnar chunk of many messages (chunks.py); same header and checksum
GROUP_MAGIC = b"\xd3LBg"  # heads each WAL write: the byte length of the frames after it (wal.py)
UNSYNCED_GROUP_MAGIC = b"\xd3LBu"  # ... the same, heading a write whose previous write was not synced
MAGICS = (FRAME_MAGIC, CHUNK_MAGIC, GROUP_MAGIC, UNSYNCED_GROUP_MAGIC)
FRAME_HEADER = struct.Struct("<4sII")
RECORD_OVERHEAD = 64  # bytes a message is counted for beyond its key, value and headers (Record.size)
MAX_FRAME_BYTES = 128 * 1024 * 1024  # twice the largest max_message_bytes
_FIXED = struct.Struct("<16sIQqBq")
_LEN = struct.Struct("<i")
_NO_SEQUENCE = -(2**63)


@dataclass(slots=True)
class Record:
    topic: str
    topic_id: bytes  # 16 bytes: tells a record of a deleted topic from one of a re-created namesake
    partition: int
    offset: int
    timestamp_us: int
    key: str | None
    value: bytes | None
    format: str
    headers: dict[str, str] | None
    message_id: str | None
    producer_id: str | None
    sequence: int | None
    _size: int = field(default=-1, compare=False, repr=False)  # `size`, computed once: several stages count it
    claim: int = field(default=0, compare=False, repr=False)  # GroupCommitter.claims when its offset was given

    @property
    def size(self) -> int:
        """Approximate bytes held, for backlog and batch-size accounting."""
        if self._size < 0:
            self._size = RECORD_OVERHEAD + message_bytes(self.key, self.value, self.headers)
        return self._size


def message_bytes(key: str | None, value: bytes | None, headers: dict[str, str] | None) -> int:
    """A message's size wherever one is measured: its key, value and header names and values."""
    size = len(value or b"") + (len(key.encode()) if key else 0)
    if headers:
        size += sum(len(name.encode()) + len(text.encode()) for name, text in headers.items())
    return size


_NULL = _LEN.pack(-1)


def _field(data: bytes | None) -> bytes:
    return _NULL if data is None else _LEN.pack(len(data)) + data


def encode(record: Record) -> bytes:
    seq = _NO_SEQUENCE if record.sequence is None else record.sequence
    topic = record.topic.encode()
    key = record.key
    body = b"".join((
        _FIXED.pack(record.topic_id, record.partition, record.offset, record.timestamp_us,
                    _FORMAT_CODE[record.format], seq),
        _LEN.pack(len(topic)), topic,
        _NULL if key is None else _field(key.encode()),
        _field(record.value),
        # a plain message (no headers, id or producer) ends with three nulls
        _NULL * 3 if record.headers is None and record.message_id is None and record.producer_id is None else b"".join((
            _field(None if record.headers is None else orjson.dumps(record.headers)),
            _field(None if record.message_id is None else record.message_id.encode()),
            _field(None if record.producer_id is None else record.producer_id.encode()))),
    ))
    return seal(FRAME_MAGIC, body)


def seal(magic: bytes, body: bytes) -> bytes:
    """A frame: header (magic, length, checksum) then the body (`seal_parts` for one piece, without
    its list: every single message's frame is sealed here)."""
    length = len(body)
    if length > MAX_FRAME_BYTES:  # recovery would read it as corruption, so never write it
        raise ValueError(f"a WAL frame of {length} bytes is over the {MAX_FRAME_BYTES}-byte frame limit")
    return FRAME_HEADER.pack(magic, length, crc32(body, crc32(_LEN.pack(length)))) + body


def seal_parts(magic: bytes, body: list[Buffer]) -> list[Buffer]:
    """`seal` of a body given in pieces, as the pieces: a large frame is written as it is,
    never copied into one bytes object."""
    length = sum(len(memoryview(part)) for part in body)
    if length > MAX_FRAME_BYTES:  # recovery would read it as corruption, so never write it
        raise ValueError(f"a WAL frame of {length} bytes is over the {MAX_FRAME_BYTES}-byte frame limit")
    crc = crc32(_LEN.pack(length))
    for part in body:
        crc = crc32(part, crc)
    return [FRAME_HEADER.pack(magic, length, crc), *body]


def frame_crc_ok(length: int, crc: int, body: bytes) -> bool:
    return crc32(body, crc32(_LEN.pack(length))) == crc


def decode(body: bytes) -> Record:
    topic_id, partition, offset, ts, fmt, seq = _FIXED.unpack_from(body, 0)
    pos = _FIXED.size
    fields: list[bytes | None] = []
    for _ in range(6):
        (n,) = _LEN.unpack_from(body, pos)
        pos += 4
        if n < 0:
            fields.append(None)
        else:
            fields.append(body[pos : pos + n])
            pos += n
    topic, key, value, headers, message_id, producer_id = fields
    assert topic is not None
    return Record(
        topic=topic.decode(),
        topic_id=topic_id,
        partition=partition,
        offset=offset,
        timestamp_us=ts,
        key=None if key is None else key.decode(),
        value=value,
        format=FORMATS[fmt],
        headers=None if headers is None else orjson.loads(headers),
        message_id=None if message_id is None else message_id.decode(),
        producer_id=None if producer_id is None else producer_id.decode(),
        sequence=None if seq == _NO_SEQUENCE else seq,
    )
