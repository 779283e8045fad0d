"""A topic's commits under this node's claims: the flusher's writer.

It keeps, by topic id, the table handle, each partition's committed end (its log-end txn version,
read once, a replay of the log since the last checkpoint, then as its own commits set it; dropped
on any failure: docs/decisions/0009-*.md) and the table version whose owner epochs were last
checked. Every commit records this node's id and the epochs of the partitions it writes
(tables/fencing.py), and refuses what would leave a gap (flush_rows.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from lakebroker.ingest_api.chunks import Chunk
from lakebroker.ingest_api.flush_rows import assemble, by_partition, contiguous_from, runs_of
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.wal import PartitionKey
from lakebroker.tables import delta, fencing
from lakebroker.tables.layout import Layout
from lakebroker.tables.topics import TopicConfig, ensure_topic_table, open_topic_table


class Rebased(Exception):
    """A partition of a commit was claimed back over another node's commits while it was planned."""


class TopicCommits:
    def __init__(self, layout: Layout, metrics: IngestMetrics, stale: Callable[[Record | Chunk], bool]) -> None:
        """`stale`: whether an item was given its offset before its partition was rebased."""
        self._layout = layout
        self._metrics = metrics
        self._stale = stale
        self._tables: dict[str, delta.KeptTable] = {}
        self._ends: dict[str, dict[int, int]] = {}
        self._verified: dict[str, int] = {}
        # This node's id and the epochs of the partitions it owns (ownership.py). No id: the table's
        # only writer (tests, benchmarks), which makes its tables.
        self.node = ""
        self.epochs: dict[PartitionKey, int] = {}

    def forget(self, topic_id: str) -> None:
        """A deleted topic: its handle and ends go."""
        self._tables.pop(topic_id, None)
        self._ends.pop(topic_id, None)

    def ends_changed(self, topic_id: str) -> None:
        """Something else wrote the topic's ends (a skip of lost offsets): read them again."""
        self._ends.pop(topic_id, None)

    def adopted(self, topic_id: str) -> None:
        """This node claimed partitions of the topic: read their ends and epochs again."""
        self._ends.pop(topic_id, None)
        self._verified.pop(topic_id, None)

    def table(self, topic: TopicConfig) -> DeltaTable:
        kept = self._tables.get(topic.topic_id)
        if kept is None:
            uri = self._layout.topic_table(topic)
            # A node's topic tables are made with their topics and opened by its claims: one missing here
            # was deleted through another node, and is not made again (TopicGone). A flusher of no node
            # (its table's only writer: tests, benchmarks) makes its own.
            opener: Callable[[str], DeltaTable] = open_topic_table if self.node else ensure_topic_table
            kept = self._tables[topic.topic_id] = delta.KeptTable(uri, functools.partial(opener, uri))
            self._metrics.flush_errors.labels(topic.name)  # starts at zero, visible before a failure
        return kept.current()

    def gone(self, topic: TopicConfig) -> bool:
        """Whether the topic's table is missing, asked after a failed commit; its handle is dropped if so."""
        try:
            missing = not delta.exists(self._layout.topic_table(topic))
        except (DeltaError, OSError):  # the storage failed the commit too: no sign of a delete
            return False
        if missing:
            self._tables.pop(topic.topic_id, None)
        return missing

    def commit(self, topic: TopicConfig, records: list[Record | Chunk]) -> dict[int, int]:
        """Commit `records` (of partitions this node owns) to the topic's table; each touched partition's
        end after it. Deposed if the table shows another owner, Rebased if an item went stale (its
        partition was claimed back meanwhile), OffsetGap if the records do not start at an end."""
        try:
            table = self.table(topic)
            topic_id = bytes.fromhex(topic.topic_id)
            partitions = {r.partition for r in records}
            if gone := {p for p in partitions if (topic_id, p) not in self.epochs}:  # lost since `_owned`
                raise fencing.Deposed(f"partitions {sorted(gone)} went to another node while this flush was "
                                      "planned", dict.fromkeys(gone, 0))
            if any(map(self._stale, records)):  # rebased since `_owned`: their offsets are others' now
                raise Rebased
            epochs = {p: self.epochs[(topic_id, p)] for p in partitions}
            version = table.version()
            if self._verified.get(topic.topic_id) != version:
                # Others committed since (nodes, jobs): a claim among them would not conflict with a
                # commit on this snapshot, so the epochs are read again first (tables/fencing.py), of
                # every partition this node owns in the topic: a later commit of another partition is
                # planned on this same snapshot unchecked.
                self._ends.pop(topic.topic_id, None)
                owned = {p: e for (t, p), e in self.epochs.items() if t == topic_id}
                lost = fencing.deposed(table, owned)
                if lost:
                    raise fencing.Deposed(f"partitions {sorted(lost)} of {topic.name!r} have another owner",
                                          {p: fencing.stored_epoch(table, p) for p in lost})
                self._verified[topic.topic_id] = version
            known = self._ends.setdefault(topic.topic_id, {})
            for p in partitions - known.keys():
                known[p] = delta.committed_end(table, p)
            ends = {p: known[p] for p in partitions}
            fresh = contiguous_from(ends, runs_of(records))
            if not fresh:
                return ends
            delta.append_partitions(
                table,
                {partition: assemble(pieces) for partition, pieces in by_partition(fresh).items()},
                txns=fencing.commit_txns(self.node, epochs, ends),
                metadata={"lakebroker.operation": "flush"},
            )
        except BaseException:
            self._ends.pop(topic.topic_id, None)  # a failed commit may still have landed: read the table again
            self._verified.pop(topic.topic_id, None)
            raise
        if table.version() == version + 1:
            self._verified[topic.topic_id] = table.version()
        else:  # delta-rs retried the commit over others' commits: a claim among them is unchecked
            self._verified.pop(topic.topic_id, None)
        known.update(ends)
        return ends
