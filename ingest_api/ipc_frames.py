"""What an Arrow IPC message decodes to, read from its header before it is decoded.

pyarrow decompresses a compressed record batch whole when it reads it, with no bound, so a body
must be sized first. A compressed buffer starts with its decoded length (8 bytes, little-endian;
-1: stored as is), and the message header (a flatbuffer, Message.fbs) says where the buffers are
and whether they are compressed. pyarrow exposes neither, so the few fields needed are read here.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from typing_extensions import Buffer

_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # a continuation marker and a zero length
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3  # MessageHeader union tags
_PREFIX = 8  # the decoded length before each compressed buffer


def stream_pieces(schema_message: bytes, batches: Iterable[pa.RecordBatch]) -> list[Buffer]:
    """The IPC stream pa.ipc.new_stream writes, in pieces, without a writer: the schema's message
    (serialized once, by the caller), each batch serialized, the end-of-stream marker."""
    return [schema_message, *(batch.serialize() for batch in batches), _END_OF_STREAM]


def decoded_size(message: pa.ipc.Message) -> int:
    """The bytes the message's body decodes to: its length, or for a compressed batch the sum of
    the lengths its buffers declare. Raises ValueError on a header that is no Arrow message."""
    body = message.body
    size = 0 if body is None else body.size
    meta = memoryview(message.metadata)
    try:
        root = _table(meta, _u32(meta, 0))
        kind = _field_u8(meta, root, 1)
        batch = _field_table(meta, root, 2)
        if kind == _DICTIONARY_BATCH and batch is not None:
            batch = _field_table(meta, batch, 1)
        if kind not in (_DICTIONARY_BATCH, _RECORD_BATCH) or batch is None or _field_table(meta, batch, 3) is None:
            return size  # not a batch, or stored uncompressed
        data = memoryview(body) if body is not None else memoryview(b"")
        declared = 0
        for offset, length in _buffers(meta, batch):
            if length >= _PREFIX:
                if not 0 <= offset <= len(data) - _PREFIX:
                    raise ValueError(f"a compressed buffer at {offset} lies outside the message body")
                (decoded,) = struct.unpack_from("<q", data, offset)
                declared += length - _PREFIX if decoded < 0 else decoded
        return declared
    except struct.error as exc:
        raise ValueError(f"an IPC message header or body is truncated ({exc})") from None


def _u32(buf: memoryview, at: int) -> int:
    return int(struct.unpack_from("<I", buf, at)[0])


def _table(buf: memoryview, at: int) -> tuple[int, int, int]:
    """A flatbuffer table: (its position, its vtable's position, the vtable's size)."""
    (soffset,) = struct.unpack_from("<i", buf, at)
    vtable = at - soffset
    (vsize,) = struct.unpack_from("<H", buf, vtable)
    return at, vtable, vsize


def _slot(buf: memoryview, table: tuple[int, int, int], field: int) -> int | None:
    """Where the table's field is stored (None: absent, the default)."""
    at, vtable, vsize = table
    entry = 4 + 2 * field
    if entry + 2 > vsize:
        return None
    (offset,) = struct.unpack_from("<H", buf, vtable + entry)
    return at + offset if offset else None


def _field_u8(buf: memoryview, table: tuple[int, int, int], field: int) -> int:
    slot = _slot(buf, table, field)
    return 0 if slot is None else int(struct.unpack_from("<B", buf, slot)[0])


def _field_table(buf: memoryview, table: tuple[int, int, int], field: int) -> tuple[int, int, int] | None:
    slot = _slot(buf, table, field)
    return None if slot is None else _table(buf, slot + _u32(buf, slot))


def _buffers(buf: memoryview, batch: tuple[int, int, int]) -> list[tuple[int, int]]:
    """RecordBatch.buffers: (offset in the body, length) of each."""
    slot = _slot(buf, batch, 2)
    if slot is None:
        return []
    vector = slot + _u32(buf, slot)
    count = _u32(buf, vector)
    return [struct.unpack_from("<qq", buf, vector + 4 + 16 * i) for i in range(count)]
