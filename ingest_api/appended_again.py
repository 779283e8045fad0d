"""Messages a partition claimed back takes again: appended to the WAL as new messages after the
other node's rows (ownership.py `adopt`), each with an id, but those already stored elsewhere; the
dedup index follows them to their new offsets."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from lakebroker.ingest_api.chunks import Chunk, chunk_bytes
from lakebroker.ingest_api.dedup import DedupIndex, Placed, dedup_id, dedup_ids, derived, key_hash, remember_placed
from lakebroker.ingest_api.group_commit import GroupCommitter, Pending, PendingChunk
from lakebroker.ingest_api.hand_off import identified
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.wal import PartitionKey
from lakebroker.tables.topics import TopicConfig

log = logging.getLogger(__name__)


def append_again(topic: TopicConfig, items: list[Record | Chunk], key: PartitionKey, placed: set[tuple[int, int]], *,
                 node: str, committer: GroupCommitter, dedup: DedupIndex) -> asyncio.Future[list[Any]]:
    """Queue items for the WAL again as new messages of their partition, each with an id
    (hand_off.py), but those whose id is `placed` (by key_hash) elsewhere; the dedup index
    learns the new offsets. An id that comes twice (a copy appended again before, and its
    original) is appended once. Done when every new copy is durable or failed (each one's outcome,
    as `asyncio.gather` with `return_exceptions` gives it)."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Any]] = []
    placed = set(placed)  # ... and then the ids appended here
    skipped = 0
    for item in items:  # one at a time: chunks and records may alternate, and their order is kept
        item = identified(item, node)
        future: asyncio.Future[Any] = loop.create_future()
        if isinstance(item, Chunk):
            chunk, hashes = _without_placed(item, topic.topic_id, placed)
            skipped += item.rows - (0 if chunk is None else chunk.rows)
            if chunk is None:
                continue
            future.add_done_callback(_remember_chunk(dedup, topic.topic_id))
            dedup.move(hashes, key[1], derived(future, _first_placed))
            committer.submit([PendingChunk(dataclasses.replace(chunk, offset=-1), future)])
        else:
            did = dedup_id(item.message_id, item.producer_id, item.sequence, item.partition)
            assert did is not None
            if (hashed := key_hash((topic.topic_id, did))) in placed:
                skipped += 1
                continue
            placed.add(hashed)
            future.add_done_callback(remember_placed(dedup, (topic.topic_id, did)))
            dedup.move([hashed], key[1], future)
            committer.submit([Pending(dataclasses.replace(item, offset=-1), future, in_order=True)])
        futures.append(future)
    if skipped:
        log.warning("%s[%d]: %d of these messages are stored already (by a node this node handed them to, "
                    "or as a copy appended before): not appended again", topic.name, key[1], skipped)

    return asyncio.gather(*futures, return_exceptions=True)


def _remember_chunk(dedup: DedupIndex, topic_hex: str) -> Callable[[asyncio.Future[Chunk]], None]:
    """A chunk appended again: its ids at their new offsets."""

    def done(future: asyncio.Future[Chunk]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        chunk = future.result()
        columns = chunk.columns
        ids = dedup_ids(columns["message_id"], columns["producer_id"], columns["sequence"], chunk.partition)
        for i, did in enumerate(ids.to_pylist()):
            if did is not None:
                dedup.remember((topic_hex, did), (chunk.partition, chunk.offset + i, chunk.timestamp_us))

    return done


def placed_hashes(placed: pa.Table | None) -> set[tuple[int, int]]:
    """The id hashes of the rows dedup_rebuild.placed_by_others found."""
    if placed is None or not placed.num_rows:
        return set()
    return set(zip(placed["hash0"].to_pylist(), placed["hash1"].to_pylist(), strict=True))


def _without_placed(chunk: Chunk, topic_hex: str,
                    placed: set[tuple[int, int]]) -> tuple[Chunk | None, list[tuple[int, int] | None]]:
    """The chunk without the rows whose id is in `placed` (by key_hash), or in a row before it (None
    if none is left), and the kept rows' id hashes (None: no id), which join `placed`."""
    columns = chunk.columns
    ids = dedup_ids(columns["message_id"], columns["producer_id"], columns["sequence"], chunk.partition).to_pylist()
    keep = []
    kept: list[tuple[int, int] | None] = []
    for did in ids:
        hashed = None if did is None else key_hash((topic_hex, did))
        if hashed is None or hashed not in placed:
            keep.append(True)
            kept.append(hashed)
        else:
            keep.append(False)
        if hashed is not None:
            placed.add(hashed)
    if all(keep):
        return chunk, kept
    if not kept:
        return None, kept
    columns = chunk.columns.filter(pa.array(keep))
    return dataclasses.replace(chunk, columns=columns, size=chunk_bytes(columns)), kept


def _first_placed(chunk: Chunk) -> Placed:
    """Where a durable chunk's first message is placed."""
    return chunk.partition, chunk.offset, chunk.timestamp_us


def uncommitted(items: list[Record | Chunk], end: int) -> list[Record | Chunk]:
    """The items' messages at or past `end` (a chunk that straddles it, cut there)."""
    out: list[Record | Chunk] = []
    for item in items:
        if isinstance(item, Chunk):
            if item.end <= end:
                continue
            if item.offset < end:
                rows = item.columns.slice(end - item.offset)
                item = dataclasses.replace(item, offset=end, columns=rows, size=chunk_bytes(rows))
        elif item.offset < end:
            continue
        out.append(item)
    return out
