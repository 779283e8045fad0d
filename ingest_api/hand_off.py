"""The identity a WAL message takes when it leaves the node that acknowledged it.

A node's WAL can hold acknowledged messages of partitions another node owns now (it lost the lease
before committing them). It sends them to the owner, or appends them again with new offsets once it
claims the partition back (at their own offsets if no other node committed to it meanwhile). Two of
these can happen to one message: the node may die after the owner stored it and before its WAL let
it go, and then its WAL hands the message on again; or the owner may keep the copy it was sent and
lose the partition before committing it, while the node claims the partition back. A message
with an id is recognised the second time by the owner's dedup index, or by the claim's look at what
other nodes stored (dedup_rebuild.placed_by_others). A message without one gets one here: the
producer id `lakebroker-node:<node id>:<partition>`, with the offset this node gave it as its
sequence. It is the same each time the same WAL item is handed on, and no two of a node's WAL
items share it: a node gives an offset of a partition once, and after a claim its new messages
follow the messages it appends again.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.ingest_api.chunks import Chunk, chunk_bytes
from lakebroker.ingest_api.records import Record

PRODUCER_PREFIX = "lakebroker-node:"


def hand_off_producer(node: str, partition: int) -> str:
    return f"{PRODUCER_PREFIX}{node}:{partition}"


def identified(item: Record | Chunk, node: str) -> Record | Chunk:
    """`item` with an id on every message: its own, else this node's producer id and its offset."""
    if isinstance(item, Record):
        if item.message_id is not None or (item.producer_id is not None and item.sequence is not None):
            return item
        return dataclasses.replace(item, producer_id=hand_off_producer(node, item.partition), sequence=item.offset)
    columns = item.columns
    missing = pc.and_(pc.is_null(columns["message_id"]),
                      pc.or_(pc.is_null(columns["producer_id"]), pc.is_null(columns["sequence"])))
    if not pc.any(missing).as_py():
        return item
    offsets = pa.array(np.arange(item.offset, item.end, dtype=np.int64))
    producer = pa.scalar(hand_off_producer(node, item.partition), pa.string())
    columns = columns.set_column(columns.schema.get_field_index("producer_id"), columns.schema.field("producer_id"),
                                 pc.if_else(missing, producer, columns["producer_id"]))
    columns = columns.set_column(columns.schema.get_field_index("sequence"), columns.schema.field("sequence"),
                                 pc.if_else(missing, offsets, columns["sequence"]))
    return dataclasses.replace(item, columns=columns, size=chunk_bytes(columns))
