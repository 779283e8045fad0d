"""An Arrow IPC stream as a batch body, and a batch's results as one.

A producer that holds its messages as columns (a DataFrame, an Arrow table) sends them as
`application/vnd.apache.arrow.stream`: one IPC stream whose columns are

    value      binary or string (a string value is stored as text, bytes as binary);
               null is a tombstone, which needs a key
    key        string (or binary holding UTF-8), optional, null for none
    headers    map of string to string, optional, null for none
    partition  any integer type, optional, null for the partitioner's choice
    id         string, optional: the message id that deduplicates a retry
    producer_id, sequence
               string and integer, optional, together: a producer's id and its sequence, which
               increases in each partition (Kafka's idempotent-producer contract: ingest_api/sequences.py)

The body is read without a copy (the columns point into it) and checked whole, before anything is
stored: the stream, every column's type, and the rows (lengths, nulls, ranges), with the first
bad row named. Its messages then take the columnar path of a JSON batch (broker.produce_columns),
so partitions, offsets, dedup and the rows in Delta are the same as for that batch sent as JSON.

The IPC stream is validated in full (offsets inside their buffers, strings valid UTF-8): a stream
that lies about its buffers would otherwise read out of bounds in the compute kernels. A compressed
stream (LZ4 or ZSTD buffers) is accepted while what its buffers declare they decode to fits the
request limit, checked before any is decoded: a few MB of zeros decode to hundreds. So is a
dictionary-encoded column: what it decodes to is summed from its entries' lengths by its indices
and held to the same limit before it is decoded (one 1 MiB entry and 100,000 one-byte indices
decode to 100 GiB). The time a body holds the event loop is bounded too: its record and dictionary
batches are counted as the stream is read (MAX_RECORD_BATCHES, MAX_DICTIONARY_BATCHES), and a
dictionary that many batches share, which validation reads again with each, counts with each.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.ingest_api import ipc_frames
from lakebroker.ingest_api.body import MAX_BATCH, MAX_KEY_CHARS, InvalidShape
from lakebroker.ingest_api.chunks import CHUNK_SCHEMA, BatchResults, ColumnarBatch, one_array
from lakebroker.tables.errors import InvalidRequest, TooLarge
from lakebroker.tables.topics import MAX_PARTITIONS

ARROW_STREAM = "application/vnd.apache.arrow.stream"
COLUMNS = ("value", "key", "headers", "partition", "id", "producer_id", "sequence")
MAX_ID_CHARS = 256
# pyarrow's writer writes a record batch per chunk of the table, and a dictionary batch where a
# chunk's dictionary is new: a producer's body holds few. Each takes event-loop time to read, though
# empty, so their count is bounded (docs/decisions/0016-arrow-bodies-bounded-by-batches-and-reads.md).
MAX_RECORD_BATCHES = 1024
MAX_DICTIONARY_BATCHES = 1024
_HEADERS = CHUNK_SCHEMA.field("headers").type
_OFFSETS = {pa.string(): np.int32, pa.binary(): np.int32, pa.large_string(): np.int64, pa.large_binary(): np.int64}
# A format repeated, and a type's nulls, kept and sliced to each batch's length (`_repeated`):
# building them per request allocated and zeroed fresh buffers for every absent column.
_KEPT: dict[str | pa.DataType, pa.Array] = {}
RESULTS_SCHEMA = pa.schema([
    pa.field("partition", pa.int32()),  # null: a duplicate whose original is not placed yet (ack=none)
    pa.field("offset", pa.int64()),  # null: not known yet (ack=none)
    pa.field("duplicate", pa.bool_(), nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
])
_RESULTS_SCHEMA_MESSAGE = RESULTS_SCHEMA.serialize().to_pybytes()


def parse_arrow_batch(body: bytes, max_decoded: int) -> ColumnarBatch:
    """The batch in `body`, as columns in CHUNK_SCHEMA. A body that is no Arrow IPC stream, or that
    Arrow cannot read as one, is a 400; one that decodes to more than `max_decoded` bytes (its
    dictionary-encoded columns decoded), or reads as more, a 413; a stream of the wrong shape (a
    column, a type, a row, too many batches) a 422 naming it."""
    table, decoded = _read(body, max_decoded)
    n = table.num_rows
    if not 1 <= n <= MAX_BATCH:
        raise InvalidShape(f"invalid batch: an Arrow body must hold 1 to {MAX_BATCH} rows, not {n}")
    names = table.column_names
    unknown = sorted(set(names) - set(COLUMNS))
    if unknown:
        raise InvalidShape(f"invalid batch: unknown columns {', '.join(unknown)} (allowed: {', '.join(COLUMNS)})")
    if len(set(names)) != len(names):
        raise InvalidShape("invalid batch: a column name appears twice")
    if "value" not in names:
        raise InvalidShape("invalid batch: the value column is required (binary or string)")
    try:
        _within(decoded + sum(_dictionary_decoded(table.column(name)) for name in names), max_decoded)
        return _batch(table)
    except pa.ArrowException as exc:  # a kernel's own limit (a 2 GiB offset, say) is the body's fault too
        raise InvalidRequest(f"the Arrow IPC stream cannot be read as a batch: {exc}") from None


def _batch(table: pa.Table) -> ColumnarBatch:
    n = table.num_rows
    got = {name: _plain(table.column(name)) for name in table.column_names}
    value, fmt = _value(got["value"])
    key = _key(got["key"]) if "key" in got else _repeated(pa.string(), n)
    message_id = _id(got["id"]) if "id" in got else _repeated(pa.string(), n)
    producer, sequence = _producer(got.get("producer_id"), got.get("sequence"), n)
    partition = _partition(got["partition"]) if "partition" in got else _repeated(pa.int64(), n)
    headers = _headers(got["headers"]) if "headers" in got else _repeated(_HEADERS, n)
    if value.null_count:
        keyless = pc.and_(pc.is_null(value), pc.is_null(key))
        if pc.any(keyless).as_py():
            raise InvalidShape(f"invalid message {_first(keyless)}: a null value is a tombstone, which needs a key")
    columns = pa.Table.from_arrays(
        [key, value, fmt, headers, message_id, producer, sequence],
        schema=CHUNK_SCHEMA,
    )
    return ColumnarBatch.of(columns, partition)


def results_arrow(results: BatchResults) -> bytes:
    """A batch's per-message results as an Arrow IPC stream of RESULTS_SCHEMA, in request order:
    the schema message, one record batch, the end-of-stream marker (what pa.ipc.new_stream writes,
    without a writer per answer)."""
    n = len(results.duplicate)
    if results.complete:  # no nulls to look for, no duplicate to pack
        packed = pa.py_buffer(bytes((n + 7) // 8))
        nullable = _as_is
    else:
        packed = pa.py_buffer(np.packbits(results.duplicate, bitorder="little"))  # Arrow's booleans are bits
        nullable = _nullable
    batch = pa.record_batch([
        nullable(pa.int32(), results.partition.astype(np.int32, copy=False)),
        nullable(pa.int64(), results.offset),
        pa.Array.from_buffers(pa.bool_(), n, [None, packed]),
        nullable(RESULTS_SCHEMA.field("timestamp").type, results.timestamp_us),
    ], schema=RESULTS_SCHEMA)
    return b"".join(ipc_frames.stream_pieces(_RESULTS_SCHEMA_MESSAGE, [batch]))


def _nullable(of: pa.DataType, values: np.ndarray) -> pa.Array:
    """`values` (64- or 32-bit, as `of` stores them) with null where negative (not known); no
    validity bitmap when all are known, and then no copy."""
    missing = values < 0
    if missing.any():
        return pa.array(values, mask=missing).view(of)
    return _as_is(of, values)


def _as_is(of: pa.DataType, values: np.ndarray) -> pa.Array:
    """`values`, every one known, without a copy."""
    return pa.Array.from_buffers(of, len(values), [None, pa.py_buffer(values)])


def wants_arrow(accept: str) -> bool:
    """Whether an Accept header asks for the results as Arrow (JSON stays the default)."""
    return ARROW_STREAM in accept.lower()


def _read(body: bytes, max_decoded: int) -> tuple[pa.Table, int]:
    """The stream as a table, validated, and what its messages decode to (a dictionary-encoded
    column as its dictionary and indices)."""
    try:
        buffer = pa.py_buffer(body)
        decoded = _decoded_size(pa.ipc.MessageReader.open_stream(buffer))
        _within(decoded, max_decoded)
        table = pa.ipc.open_stream(buffer).read_all()
        table.validate()  # the layout, which the buffer sizes below rely on
        # Full validation reads a chunk's dictionary with each chunk, shared or not: what that reads is
        # held to the request limit first (docs/decisions/0016).
        read = sum(chunk.get_total_buffer_size() for column in table.columns for chunk in column.chunks)
        if read > max_decoded:
            raise TooLarge(f"the Arrow IPC stream reads as {read} bytes, each batch with its dictionaries, over "
                           f"the request limit of {max_decoded}: send it in fewer batches or smaller requests")
        table.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:  # ArrowInvalid is both
        raise InvalidRequest(f"malformed Arrow IPC stream: {exc}") from None
    return table, decoded


def _decoded_size(messages: pa.ipc.MessageReader) -> int:
    """The sum of the messages' decoded sizes, read one by one: one past a bound on their count is
    refused before the next is read."""
    decoded = batches = others = 0
    for message in messages:
        if message.type == "record batch":
            batches += 1
            if batches > MAX_RECORD_BATCHES:
                raise InvalidShape(f"invalid batch: an Arrow body holds at most {MAX_RECORD_BATCHES} record "
                                   "batches: write its rows in fewer (a table's chunks are its batches; "
                                   "combine_chunks() makes one)")
        else:
            others += 1
            if others > 1 + MAX_DICTIONARY_BATCHES:  # and the schema
                raise InvalidShape(f"invalid batch: an Arrow body holds at most {MAX_DICTIONARY_BATCHES} "
                                   "dictionary batches: write its rows in fewer batches (combine_chunks() "
                                   "makes one, with one dictionary per column)")
        decoded += ipc_frames.decoded_size(message)
    return decoded


def _within(decoded: int, max_decoded: int) -> None:
    if decoded > max_decoded:
        raise TooLarge(f"the Arrow IPC stream decodes to {decoded} bytes, over the request limit of "
                       f"{max_decoded}: send it in smaller requests")


def _dictionary_decoded(column: pa.ChunkedArray) -> int:
    """What a dictionary-encoded column's values take decoded (0 for a plain column), summed from
    its entries' lengths by its indices without decoding a row."""
    if not pa.types.is_dictionary(column.type):
        return 0
    t = column.type.value_type
    if pa.types.is_primitive(t) or pa.types.is_fixed_size_binary(t):  # a partition, say: one width for every row
        return len(column) * max(1, int(t.bit_width) // 8)
    width = _OFFSETS.get(t)
    if width is None:  # views too: Arrow cannot decode those
        raise InvalidShape(f"invalid batch: only strings, bytes and integers may be dictionary-encoded, not {t}")
    total = 0
    for chunk in column.chunks:  # each chunk may have a dictionary of its own
        at = chunk.indices.drop_null() if chunk.indices.null_count else chunk.indices
        if not len(at):
            continue
        # Entry i spans offsets i to i + 1: only the rows' entries are looked at, however large the dictionary
        # (validated: every index is an entry's).
        entries = chunk.dictionary
        offsets = np.frombuffer(entries.buffers()[1], width)[entries.offset:]
        rows = at.to_numpy().astype(np.int64)
        total += int((offsets[rows + 1] - offsets[rows]).sum())
    return total


def _plain(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array. A dictionary-encoded one (a pandas category, say) is decoded chunk by
    chunk, its size decoded held to the request limit first (`_dictionary_decoded`): each chunk may
    have a dictionary of its own, and together they may not fit the indices' type."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    return one_array(column)


def _value(column: pa.Array) -> tuple[pa.Array, pa.Array]:
    t = column.type
    if _is_string(t):
        fmt = "text"
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t) \
            or pa.types.is_fixed_size_binary(t):
        fmt = "binary"
    else:
        raise InvalidShape(f"invalid batch: the value column must be binary or string, not {t}")
    # string and binary share a layout: a view, where a cast would build a new array
    value = column.view(pa.binary()) if t == pa.string() else column.cast(pa.binary())
    n = len(value)
    formats = _repeated(fmt, n) if not value.null_count else pc.if_else(pc.is_valid(value), fmt, "json")
    return value, formats


def _repeated(what: str | pa.DataType, n: int) -> pa.Array:
    """`n` times a format (a string), or `n` nulls of a type."""
    kept = _KEPT.get(what)
    if kept is None or len(kept) < n:
        size = max(n, 2 * len(kept) if kept is not None else 0)
        kept = _KEPT[what] = pa.repeat(what, size) if isinstance(what, str) else pa.nulls(size, what)
    return kept.slice(0, n)


def _key(column: pa.Array) -> pa.Array:
    t = column.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        try:
            column = column.cast(pa.string())  # checks UTF-8
        except pa.ArrowInvalid:
            raise InvalidShape("invalid batch: the key column holds bytes that are not UTF-8") from None
    elif not _is_string(t):
        raise InvalidShape(f"invalid batch: the key column must be a string, not {t}")
    key = column.cast(pa.string())
    _lengths(key, "key", 0, MAX_KEY_CHARS)
    return key


def _id(column: pa.Array) -> pa.Array:
    if not _is_string(column.type):
        raise InvalidShape(f"invalid batch: the id column must be a string, not {column.type}")
    ids = column.cast(pa.string())
    _lengths(ids, "id", 1, MAX_ID_CHARS)
    return ids


def _producer(producer: pa.Array | None, sequence: pa.Array | None, n: int) -> tuple[pa.Array, pa.Array]:
    if producer is None and sequence is None:
        return _repeated(pa.string(), n), _repeated(pa.int64(), n)
    if producer is None or sequence is None:
        raise InvalidShape("invalid batch: producer_id and sequence come together")
    if not _is_string(producer.type):
        raise InvalidShape(f"invalid batch: the producer_id column must be a string, not {producer.type}")
    if not pa.types.is_integer(sequence.type):
        raise InvalidShape(f"invalid batch: the sequence column must be of an integer type, not {sequence.type}")
    producer = producer.cast(pa.string())
    _lengths(producer, "producer_id", 1, MAX_ID_CHARS)
    lone = pc.xor(pc.is_valid(producer), pc.is_valid(sequence))
    if pc.any(lone).as_py():
        raise InvalidShape(f"invalid message {_first(lone)}: producer_id and sequence come together")
    if sequence.null_count < len(sequence):
        wrong = pc.less(sequence, 0) if pa.types.is_signed_integer(sequence.type) else \
            pc.greater(sequence, pa.scalar(2**63 - 1, pa.uint64()))
        if pc.any(wrong).as_py():
            raise InvalidShape(f"invalid message {_first(wrong)}: sequence must be between 0 and 2^63 - 1")
    return producer, sequence.cast(pa.int64())


def _partition(column: pa.Array) -> pa.Array:
    if not pa.types.is_integer(column.type):
        raise InvalidShape(f"invalid batch: the partition column must be of an integer type, not {column.type}")
    if column.null_count < len(column):
        wrong = pc.or_(pc.less(column, 0), pc.greater(column, MAX_PARTITIONS - 1))
        if pc.any(wrong).as_py():
            raise InvalidShape(f"invalid message {_first(wrong)}: partition must be between 0 and "
                               f"{MAX_PARTITIONS - 1}, not {column[_first(wrong)].as_py()}")
    return column.cast(pa.int64())


def _headers(column: pa.Array) -> pa.Array:
    t = column.type
    if not (pa.types.is_map(t) and _is_string(t.key_type) and _is_string(t.item_type)):
        raise InvalidShape(f"invalid batch: the headers column must be a map of string to string, not {t}")
    if column.items.null_count:
        owner = _row_of_item(column, int(np.flatnonzero(column.items.is_null().to_numpy(zero_copy_only=False))[0]))
        raise InvalidShape(f"invalid message {owner}: a header's value is null (header values are strings)")
    return column.cast(_HEADERS)


def _row_of_item(column: pa.MapArray, item: int) -> int:
    """The row whose map holds the `item`-th entry of the map's flat items."""
    offsets = column.offsets.to_numpy()
    return int(np.searchsorted(offsets, item, side="right")) - 1


def _lengths(column: pa.Array, name: str, shortest: int, longest: int) -> None:
    if column.null_count == len(column):
        return
    lengths = pc.utf8_length(column)
    wrong = pc.or_(pc.less(lengths, shortest), pc.greater(lengths, longest))
    if pc.any(wrong).as_py():
        raise InvalidShape(f"invalid message {_first(wrong)}: {name} must be {shortest} to {longest} characters long")


def _first(mask: pa.Array) -> int:
    """The first row where `mask` is true (nulls count as false)."""
    return int(np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))[0])


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))
