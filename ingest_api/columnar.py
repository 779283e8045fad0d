"""A parsed batch body straight into Arrow columns, for the columnar produce path.

The body is parsed by orjson (`body.fast_batch_items`: a body it reads differently from the
per-message path's exact parser cannot take this path); its values then go into one list per
field and each list becomes an Arrow array at once: Arrow checks the types (a string column
refuses 5, true and objects; the partition column must come out as integers), and the limits
are checked over whole columns. A batch takes this path when every message is an object of
`key`, `value` (a string or null), `partition` and `id` only, within the limits; anything else
(headers, value_b64, a JSON value that is not a string, producer_id/sequence, a limit broken)
returns None and goes the per-message way, which gives the same answers and the same errors.

Parsers that build Arrow columns themselves cost more per message and cannot tell an absent
value from a null one (docs/decisions/0006-orjson-parses-batches-for-the-columnar-path.md).
"""

from __future__ import annotations

import gc
from itertools import repeat
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.ingest_api.body import MAX_KEY_CHARS, BatchItems, fast_batch_items
from lakebroker.ingest_api.chunks import CHUNK_SCHEMA, ColumnarBatch
from lakebroker.tables.topics import MAX_PARTITIONS

_OPTIONAL = ("key", "partition", "id")
_REFUSED = (pa.ArrowException, TypeError, ValueError, OverflowError, AttributeError)  # UnicodeError is a ValueError
_ABSENT = object()  # no JSON value: a message without "value" refuses the string column


def parse_batch_body(kind: str, body: bytes) -> ColumnarBatch | BatchItems:
    """A batch body as columns, or, when it cannot take the columnar path, as the parsed items for
    the per-message one. The cyclic garbage collector is paused meanwhile: the parse makes a dict
    per message, and those of a columnar batch are all freed (by reference count) before it
    resumes, so no collection walks them or promotes them into older generations, whose full
    collections stop the event loop (docs/decisions/0004-garbage-collector-tuned-for-the-request-path.md)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        items = fast_batch_items(kind, body)
        columnar = columns_of(items)
        if columnar is None:
            return items
        del items  # the dicts go now, while the collector is paused
        return columnar
    finally:
        if enabled:
            gc.enable()


def columns_of(batch: BatchItems) -> ColumnarBatch | None:
    items = batch.items
    n = len(items)
    try:
        # Every message is an object with a value (a non-object has no .get, an absent value is
        # not a string) and no field but these four: each field counted, the counts add up.
        value = pa.array([m.get("value", _ABSENT) for m in items], pa.string())
        fields = sum(map(len, items))
        present = {name: sum(map(dict.__contains__, items, repeat(name))) if fields > n else 0 for name in _OPTIONAL}
        if fields != n + sum(present.values()):
            return None
        key = _text(items, "key", 0, MAX_KEY_CHARS) if present["key"] else pa.nulls(n, pa.string())
        message_id = _text(items, "id", 1, 256) if present["id"] else pa.nulls(n, pa.string())
        partition = _partition(items) if present["partition"] else pa.nulls(n, pa.int64())
    except _REFUSED:
        return None
    if key is None or message_id is None or partition is None:
        return None
    fmt = pc.if_else(pc.is_valid(value), "text", "json") if value.null_count else pa.repeat("text", n)
    columns = pa.Table.from_arrays(
        [key, value.view(pa.binary()), fmt, pa.nulls(n, CHUNK_SCHEMA.field("headers").type), message_id,
         pa.nulls(n, pa.string()), pa.nulls(n, pa.int64())],
        schema=CHUNK_SCHEMA,
    )
    return ColumnarBatch(columns, partition, batch.rebuilt())


def _text(items: list[dict[str, Any]], name: str, shortest: int, longest: int) -> pa.Array | None:
    column = pa.array([m.get(name) for m in items], pa.string())
    if column.null_count == len(column):
        return column
    lengths = pc.min_max(pc.utf8_length(column)).as_py()
    return column if shortest <= lengths["min"] and lengths["max"] <= longest else None


def _partition(items: list[dict[str, Any]]) -> pa.Array | None:
    column = pa.array([m.get("partition") for m in items])  # inferred: any float, bool or string shows in the type
    if pa.types.is_null(column.type):
        return column.cast(pa.int64())
    if column.type != pa.int64():
        return None
    bounds = pc.min_max(column).as_py()
    return column if bounds["min"] >= 0 and bounds["max"] <= MAX_PARTITIONS - 1 else None
