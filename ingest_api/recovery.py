"""Recovery at start: from the WAL and the topic tables, each partition's assigned end, what the
flusher still has to commit, the partitions WAL damage holds, and the dedup index rebuilt.

The WAL's items are taken in log order, so each partition's items reach the flusher in offset
order: any prefix that a bounded flush takes then continues the table with no gap. Items below a
partition's committed end are in the table already (a crash between a Delta commit and the WAL's
cleanup); a chunk that straddles it is handed over whole, and the flusher drops its rows below.

A topic whose table cannot be read (a damaged log) stops only that topic: its WAL items are kept
and parked like those of any partition this node does not own yet, and ingest_api/cluster.py
claims its partitions once the table reads again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deltalake.exceptions import DeltaError

from lakebroker.ingest_api.chunks import Chunk
from lakebroker.ingest_api.dedup import DedupIndex
from lakebroker.ingest_api.dedup_rebuild import rebuild as rebuild_dedup
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.reader import unreadable
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.sequences import SequenceMarks
from lakebroker.ingest_api.wal import PartitionKey, Wal
from lakebroker.ingest_api.wal_damage import Damage, find_damage
from lakebroker.tables.layout import Layout
from lakebroker.tables.topics import TopicConfig, committed_ends

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

log = logging.getLogger(__name__)


@dataclass
class Recovered:
    committed: dict[PartitionKey, int]  # each partition's committed end: the next offset its table holds
    assigned: dict[PartitionKey, int]  # each partition's assigned end: the next offset produce gives
    unflushed: list[Record | Chunk]  # in log order: what the flusher still has to commit
    damage: list[Damage]  # offsets a corrupt WAL record cost, per partition
    unreadable: dict[str, str]  # topic id -> why its table could not be read


def recover(wal: Wal, layout: Layout, topics: list[TopicConfig], dedup: DedupIndex, metrics: IngestMetrics, *,
            dedup_window_s: float, node: str, marks: SequenceMarks | None = None) -> Recovered:
    """Blocking: run it in a thread. `node`: this data dir's node id. Its WAL items below the end of
    its own newest commit to a partition are in the table; the rest are not, even where
    another node's commits have since passed their offsets (ingest_api/cluster.py sorts those out)."""
    committed, table_ends, unreadable = _committed_ends(layout, topics, node)
    report = wal.recover()
    for span in report.corrupt:
        metrics.wal_corrupt.inc()
        log.error("WAL corruption in %s bytes %d-%d was skipped", span.segment, span.start, span.end)
    names = {bytes.fromhex(t.topic_id): t.name for t in topics}
    # An unreadable table's end is unknown: its items all wait for the claim, which reads the table.
    readable = {tid: name for tid, name in names.items() if tid.hex() not in unreadable}
    damage = find_damage(report.items, committed, readable, report.corrupt, table_ends)
    assigned, unflushed, pending = replay_plan(report.items, committed, names)
    log.info("recovered: %d WAL records, %d not yet in Delta, %d torn bytes (%d of the records in %d batch "
             "chunks)", len(report.records) + sum(c.rows for c in report.chunks), pending, report.torn_bytes,
             sum(c.rows for c in report.chunks), len(report.chunks))
    del report  # what is in the tables already goes before the dedup index's rebuild reads them
    rebuild_dedup(dedup, layout, topics, [r for r in unflushed if isinstance(r, Record)],
                  [c for c in unflushed if isinstance(c, Chunk)], committed, window_s=dedup_window_s,
                  unreadable=set(unreadable), marks=marks)
    return Recovered(committed, assigned, unflushed, damage, unreadable)


def _committed_ends(layout: Layout, topics: list[TopicConfig], node: str) -> tuple[
        dict[PartitionKey, int], dict[PartitionKey, int], dict[str, str]]:
    """Every readable topic's partition ends, this node's own and the table's (committed_ends), and
    why each other topic's table could not be read."""
    committed: dict[PartitionKey, int] = {}
    table_ends: dict[PartitionKey, int] = {}
    refused: dict[str, str] = {}
    for topic in topics:
        try:
            committed.update(committed_ends(layout, [topic], mark=True, node=node, table_ends=table_ends))
        except DeltaError as exc:
            refused[topic.topic_id] = unreadable(layout, topic, exc).message
            log.error("%s", refused[topic.topic_id])
    return committed, table_ends, refused


def replay_plan(items: Iterable[Record | Chunk], committed: Mapping[PartitionKey, int],
                live: Mapping[bytes, object]) -> tuple[dict[PartitionKey, int], list[Record | Chunk], int]:
    """Each partition's assigned end, the items not yet in their tables (in log order), and how
    many messages those hold. A deleted topic's items (its id not in `live`) are left out."""
    assigned = dict(committed)
    unflushed: list[Record | Chunk] = []
    pending = 0
    for r in items:
        if r.topic_id not in live:
            continue
        key = (r.topic_id, r.partition)
        end = r.end if isinstance(r, Chunk) else r.offset + 1
        assigned[key] = max(assigned.get(key, 0), end)
        if end > committed.get(key, 0):
            unflushed.append(r)
            pending += end - max(r.offset, committed.get(key, 0))
    return assigned, unflushed, pending
