"""WAL damage: which offsets a corrupt WAL span cost, found at recovery.

A frame that fails its checksum cannot say whose records it held. The records around it can:
within one partition the WAL holds offsets in order, so after the records Delta already has,
any offset that no recovered record or chunk holds was in the damaged bytes. Each such hole is a
`Damage`; the flusher holds the partition at it (never committing around a hole) until an
operator skips it (`lakebroker wal skip`), which records the loss.

A hole is found from the records alone, so it is found again after a restart that released the
damaged segment itself. A hole can be seen only below a later record of the same partition. Records lost at the very end
of a partition's WAL leave no trace in what survives, so their offsets are assigned again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from lakebroker.ingest_api.chunks import Chunk
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.wal import CorruptSpan, PartitionKey

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Damage:
    topic: str
    topic_id: bytes
    partition: int
    first: int  # the first lost offset
    last: int  # the last one, inclusive
    spans: str  # the corrupt WAL bytes that held them (one of them, at least)

    @property
    def key(self) -> PartitionKey:
        return (self.topic_id, self.partition)

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def public(self) -> dict[str, object]:
        return {"topic": self.topic, "partition": self.partition, "first_offset": self.first,
                "last_offset": self.last, "lost": self.count, "wal_damage": self.spans}

    def describe(self) -> str:
        return (f"partition {self.partition} of {self.topic!r}: offsets {self.first}-{self.last} "
                f"({self.count}) were lost to WAL damage ({self.spans})")


def describe_spans(spans: Iterable[CorruptSpan]) -> str:
    return ", ".join(f"{s.segment} bytes {s.start}-{s.end}" for s in spans)


def find_damage(items: Iterable[Record | Chunk], committed: Mapping[PartitionKey, int],
                topics: Mapping[bytes, str], corrupt: list[CorruptSpan],
                table_ends: Mapping[PartitionKey, int] | None = None) -> list[Damage]:
    """Every hole in each partition's recovered items past what Delta holds, in offset order.
    `items` are in log order; `topics` names the live topics by id (others are skipped).

    In a cluster `committed` is this node's own end, and a hole below the table's end
    (`table_ends`) is no damage: offsets another node used while this one's messages went to it or
    waited to be appended again at a claim, whose WAL copies this node let go."""
    # With no corrupt span left to name, the damaged segment was released by an earlier run
    # (its readable records were committed); the hole behind it is the same loss.
    spans = describe_spans(corrupt) or "a segment since released; its copy is in wal/quarantine/"
    expected: dict[PartitionKey, int] = {}
    found: list[Damage] = []
    for r in items:
        key = (r.topic_id, r.partition)
        name = topics.get(r.topic_id)
        if name is None:
            continue
        at = expected.get(key, committed.get(key, 0))
        end = r.end if isinstance(r, Chunk) else r.offset + 1
        if table_ends is not None:
            at = max(at, table_ends.get(key, 0))
        if r.offset > at:
            found.append(Damage(name, r.topic_id, r.partition, at, r.offset - 1, spans))
        expected[key] = max(at, end)
    return found


class HeldPartitions:
    """The partitions WAL damage holds, each at its first lost offset until an operator skips the
    loss (`lakebroker wal skip`); a partition with several holes is held again at the next."""

    def __init__(self, hold: Callable[[PartitionKey, int], None], metrics: IngestMetrics) -> None:
        self._hold = hold  # the flusher keeps the partition's items from that offset on aside
        self._metrics = metrics
        self._held: dict[PartitionKey, list[Damage]] = {}

    def add(self, damage: Damage) -> None:
        log.error("%s; the partition is held there until an operator runs `lakebroker wal skip %s %d`",
                  damage.describe(), damage.topic, damage.partition)
        held = self._held.setdefault(damage.key, [])
        held.append(damage)
        if len(held) == 1:
            self._hold(damage.key, damage.first)
        self._count(damage.topic, damage.partition, held)

    def all(self) -> list[Damage]:
        return [d for held in self._held.values() for d in held]

    def firsts(self) -> list[Damage]:
        """Each held partition's first loss: where it is held."""
        return [held[0] for held in self._held.values()]

    def lost(self, key: PartitionKey) -> int:
        """Offsets WAL damage cost the partition that no skip has recorded yet."""
        return sum(d.count for d in self._held.get(key, ()))

    def first(self, key: PartitionKey) -> Damage | None:
        held = self._held.get(key)
        return held[0] if held else None

    def skipped(self, key: PartitionKey) -> None:
        """The first loss of the partition was recorded and its log end moved past it."""
        held = self._held[key]
        done = held.pop(0)
        if held:
            self._hold(key, held[0].first)  # its items past the next hole, once they come back
        else:
            del self._held[key]
        self._count(done.topic, done.partition, held)

    def forget_topic(self, name: str) -> None:
        for key in [k for k, held in self._held.items() if held[0].topic == name]:
            del self._held[key]

    def _count(self, topic: str, partition: int, held: list[Damage]) -> None:
        self._metrics.wal_lost_offsets.labels(topic, str(partition)).set(sum(d.count for d in held))


class HeldItems:
    """The flusher's side of damage: each damaged partition's items past its first lost offset,
    kept out of every flush until the hole is skipped (`release`)."""

    def __init__(self) -> None:
        self._from: dict[PartitionKey, int] = {}  # a damaged partition's first lost offset
        self._items: dict[PartitionKey, list[Record | Chunk]] = {}  # its items past the hole
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self._from)

    def hold(self, key: PartitionKey, first_lost: int) -> None:
        self._from[key] = first_lost
        self._items.setdefault(key, [])

    def first_lost(self, key: PartitionKey) -> int:
        return self._from[key]

    def count(self, key: PartitionKey) -> int:
        return len(self._items.get(key, ()))

    def keep_back(self, records: Iterable[Record | Chunk]) -> list[Record | Chunk]:
        """The records not past a hole; the others are held."""
        out: list[Record | Chunk] = []
        for r in records:
            first = self._from.get((r.topic_id, r.partition))
            if first is not None and r.offset >= first:
                self._items[(r.topic_id, r.partition)].append(r)
                self.bytes += r.size
            else:
                out.append(r)
        return out

    def release(self, key: PartitionKey) -> list[Record | Chunk]:
        """The hole is skipped: the partition's held items, to flush."""
        del self._from[key]
        items = self._items.pop(key)
        self.bytes -= sum(r.size for r in items)
        return items

    def forget_topic(self, topic_id: bytes) -> None:
        for key in [k for k in self._from if k[0] == topic_id]:
            self.release(key)
