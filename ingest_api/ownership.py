"""The partitions this node owns, and what it keeps of the ones it does not.

Membership (cluster.py) decides ownership from the leases and tells this part: `adopt` opens
claimed partitions, `disown` closes lost ones, `hand_over` closes one and commits what it took.
The produce paths ask `check_open` before they queue a message. A node's WAL can hold items of
partitions it does not own now (it lost the lease before committing them): they are parked here
until it owns the partition again (`adopt` places them) or the router has handed them to the owner
(`take_parked` / `parked_sent`). The WAL keeps every such item until then (`committed_below`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import pyarrow as pa

from lakebroker.ingest_api.appended_again import append_again, placed_hashes, uncommitted
from lakebroker.ingest_api.chunks import Chunk
from lakebroker.ingest_api.dedup import DedupIndex
from lakebroker.ingest_api.dedup_rebuild import handed_ids, restore
from lakebroker.ingest_api.flusher import Flusher
from lakebroker.ingest_api.group_commit import GroupCommitter
from lakebroker.ingest_api.hand_off import identified
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.not_here import NoOwnerYet, NotOwner
from lakebroker.ingest_api.partitioner import Partitioner
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.wal import PartitionKey, Wal
from lakebroker.tables.ownership import Pair
from lakebroker.tables.topics import TopicConfig

log = logging.getLogger(__name__)
_NEVER = 2**63
MOVED = -1  # the claim of an item a flush or WAL write held while `adopt` placed a copy of it again
LEARN_SLICE = 8192  # ids a node takes over, remembered between the event loop's other turns


class Leases(Protocol):
    """What this part asks of the cluster's leases (cluster.Membership)."""

    node: str

    def owner_url(self, pair: Pair) -> str | None: ...

    def own_url(self) -> str: ...

    def wake(self) -> None: ...


class Ownership:
    def __init__(self, *, leases: Leases, committer: GroupCommitter, flusher: Flusher, partitioner: Partitioner,
                 wal: Wal, dedup: DedupIndex, topics: Callable[[], Mapping[str, TopicConfig]],
                 metrics: IngestMetrics, dedup_window_s: float, release_wal: Callable[[], None]) -> None:
        self.leases = leases
        self.committer = committer
        self.flusher = flusher
        self.partitioner = partitioner
        self.wal = wal
        self.dedup = dedup
        self._topics = topics
        self.dedup_window_s = dedup_window_s
        self._release_wal = release_wal
        # The partitions this node may commit, with their epochs; those open to produce (an owned
        # partition being handed over is closed first); and its WAL items of partitions it does not
        # own, kept (their WAL segments too) until it owns them again.
        self.epochs: dict[PartitionKey, int] = flusher.epochs
        self.accepting: set[PartitionKey] = set()
        self.parked: dict[PartitionKey, list[Record | Chunk]] = {}
        self._floors: dict[PartitionKey, int] = {}  # the WAL keeps each such partition's items from here
        # ... and lets go of its items below here: they were handed to the partition's owner (router.py).
        self._handed: dict[PartitionKey, int] = {}
        self._sending: dict[PartitionKey, list[Record | Chunk]] = {}  # parked items on their way to the owner
        # Topics whose table could not be read (topic id -> why): their partitions wait for a claim that
        # reads the table, retried at each heartbeat; their items stay parked meanwhile.
        self.unreadable: dict[str, str] = {}
        metrics.parked_messages.set_function(
            lambda: sum(_rows(i) for held in (self.parked, self._sending) for items in held.values() for i in items))

    # -- what this node owns ------------------------------------------------------------
    def owns(self, topic_name: str, partition: int) -> bool:
        topic = self._topics().get(topic_name)
        return topic is not None and (bytes.fromhex(topic.topic_id), partition) in self.epochs

    def owned_pairs(self) -> set[Pair]:
        return {(k[0].hex(), k[1]) for k in self.epochs}

    def own_end(self, key: PartitionKey, before: int | None) -> int:
        """Where this node's own commits to a partition end: `before`, the end its last commit
        recorded in the table (tables/fencing.py), else the committed end it knows."""
        return self.flusher.committed.get(key, 0) if before is None else before

    def check_open(self, topic: TopicConfig, topic_id: bytes, partitions: set[int]) -> None:
        """Refuse a produce with a message for a partition this node does not take now."""
        for partition in sorted(partitions):
            if (topic_id, partition) not in self.accepting:
                raise self.not_here(topic, partition)

    def not_here(self, topic: TopicConfig, partition: int) -> NotOwner | NoOwnerYet:
        """The refusal of a message for a partition this node does not take now: 421 naming the owner,
        or, while the partition is between owners (even on its way to this node), 503 to retry."""
        url = self.leases.owner_url((topic.topic_id, partition))
        if url is None or url == self.leases.own_url():
            unreadable = self.unreadable.get(topic.topic_id)
            if unreadable is not None:  # not between owners: its claim waits for the table to read again
                return NoOwnerYet(unreadable, 5.0)
            return NoOwnerYet(f"partition {partition} of {topic.name!r} is changing owners; retry in a second", 1.0)
        return NotOwner(f"partition {partition} of {topic.name!r} is not owned by this node: its owner is {url}",
                        partition, url)

    # -- taking partitions --------------------------------------------------------------
    async def learn_ids(self, placed: pa.Table) -> None:
        """Remember ids other nodes placed (dedup_rebuild.placed_by_others), a slice at a time
        between the loop's other work."""
        for start in range(0, placed.num_rows, LEARN_SLICE):
            restore(self.dedup, placed.slice(start, LEARN_SLICE))
            await asyncio.sleep(0)

    async def learn_handed_ids(self, topic: TopicConfig, claimed: dict[int, tuple[int, int, int | None]]) -> None:
        """Before `adopt`, as it takes them: the ids of the WAL items that go on at their own offsets
        (see `adopt`), from the snapshot of what this node holds of those partitions now."""
        topic_id = bytes.fromhex(topic.topic_id)
        items = [item for p, (_, end, before) in claimed.items() if self.own_end((topic_id, p), before) == end
                 for item in (*self.parked.get((topic_id, p), ()), *self._sending.get((topic_id, p), ()))]
        if items:
            await self.learn_ids(await asyncio.to_thread(handed_ids, items, self.leases.node,
                                                         window_s=self.dedup_window_s))

    def adopt(self, topic: TopicConfig, claimed: dict[int, tuple[int, int, int | None]],
              others: pa.Table | None = None) -> None:
        """Open partitions this node has just claimed: partition -> (epoch, the end the claim found,
        this node's own end before it). This node's WAL items of a partition go on at their offsets
        if no other node committed to it since this node's last commit; otherwise they were never
        committed and are appended again, with new offsets after the claimed end, except the messages
        whose ids are in `others` (dedup_rebuild.placed_by_others: a retry placed them elsewhere).

        Items that go on at their offsets are committed with the ids a hand-off gives them, which
        `learn_handed_ids` taught the dedup index: this node (or its run before a restart) may have
        sent them to a node that kept a copy and lost the partition before committing it. That copy,
        appended again there or sent here, is then known by its id."""
        topic_id = bytes.fromhex(topic.topic_id)
        for partition, (epoch, end, before) in claimed.items():
            key = (topic_id, partition)
            items = sorted(self.parked.pop(key, []) + self._sending.pop(key, []), key=lambda i: i.offset)
            self._handed.pop(key, None)  # from here on this node gives the partition's offsets again
            mine_until = self.own_end(key, before)
            if mine_until == end:
                self.flusher.add([identified(i, self.leases.node) for i in items])
                self.committer.next_offsets[key] = max(self.committer.next_offsets.get(key, 0), end)
                self.flusher.committed[key] = max(end, self.flusher.committed.get(key, 0))
                self._floors.pop(key, None)
            else:
                # Everything this node took of the partition goes on after the claimed end, now: what is
                # parked or on its way here, pending in the flusher, taken by a flush under way, and in a
                # WAL write under way; none of it is in the table. The copies under way are `MOVED`: the
                # flush and the write that hold them answer them as moved, and place them nowhere.
                self.committer.rebase(key, end)
                self.flusher.committed[key] = end
                under_way = self.flusher.in_flush(key) + self.committer.unwritten(key)
                for item in under_way:
                    item.claim = MOVED
                items = sorted(items + self.flusher.take_pending(key) + under_way, key=lambda i: i.offset)
                again = uncommitted(items, mine_until)
                if again:
                    log.warning("%s[%d]: appending %d messages again that this node took before another node "
                                "owned the partition", topic.name, partition, sum(_rows(i) for i in again))
                    # The WAL keeps the copies it holds until the new ones are durable.
                    self._floors[key] = min(self._floors.get(key, mine_until), items[0].offset)
                    self._append_again(topic, again, key, placed_hashes(others))
                else:
                    self._floors.pop(key, None)
            self.epochs[key] = epoch
            self.accepting.add(key)
        self.flusher.commits.adopted(topic.topic_id)
        self._restrict_keyless(topic)

    def _append_again(self, topic: TopicConfig, items: list[Record | Chunk], key: PartitionKey,
                      placed: set[tuple[int, int]]) -> None:
        """`append_again`; the WAL keeps the old copies (the floor) until the new ones are durable."""
        appended = append_again(topic, items, key, placed, node=self.leases.node, committer=self.committer,
                                dedup=self.dedup)

        def durable(outcomes: asyncio.Future[list[Any]]) -> None:
            if not outcomes.cancelled() and not any(isinstance(o, BaseException) for o in outcomes.result()):
                self._floors.pop(key, None)

        appended.add_done_callback(durable)

    def placed_again_if_stale(self, items: list[Record | Chunk]) -> list[Record | Chunk]:
        """The items that are not stale items of an owned partition; those (given their offsets before the
        partition's rebase, and not under way then: held back behind a damaged WAL) are appended again.
        Those `adopt` placed again already (`MOVED`) go nowhere. Their waiters were told the partition
        moved."""
        stale: dict[PartitionKey, list[Record | Chunk]] = {}
        rest = []
        for item in items:
            if item.claim == MOVED:
                continue  # placed again when its partition was claimed (`adopt`)
            key = (item.topic_id, item.partition)
            if key in self.epochs and self.committer.stale(item):
                stale.setdefault(key, []).append(item)
            else:
                rest.append(item)
        topics = {bytes.fromhex(t.topic_id): t for t in self._topics().values()}
        for key, held in stale.items():
            topic = topics.get(key[0])
            if topic is None:
                continue  # deleted meanwhile
            log.warning("%s[%d]: appending %d messages again that this node gave offsets before another node "
                        "committed to the partition", topic.name, key[1], sum(_rows(i) for i in held))
            self._floors[key] = min(self._floors.get(key, held[0].offset), min(i.offset for i in held))
            self._append_again(topic, sorted(held, key=lambda i: i.offset), key, set())
        return rest

    # -- letting partitions go ----------------------------------------------------------
    def disown(self, pairs: set[Pair]) -> None:
        """Partitions whose lease this node lost: closed at once; what it holds of them is parked by the
        flusher (their commits would be refused)."""
        for topic_hex, partition in pairs:
            key = (bytes.fromhex(topic_hex), partition)
            self.accepting.discard(key)
            self.epochs.pop(key, None)
            self.flusher.fail_waiters(key)
        self._restrict_all()
        if pairs:
            self.flusher.wake()

    def deposed(self, topic: TopicConfig, partitions: frozenset[int]) -> None:
        """A commit found a newer owner's epoch in the table: closed now, claimed again by a heartbeat."""
        self.disown({(topic.topic_id, p) for p in partitions})
        self.leases.wake()

    def orphaned(self, items: list[Record | Chunk]) -> None:
        """Items a flush left out: parked if their partition is not this node's, else (stale) placed again."""
        self.park(self.placed_again_if_stale(items))

    async def hand_over(self, pair: Pair, attempts: int = 20) -> bool:
        """Close an owned partition to produce and commit everything it took; True once nothing of it
        is left uncommitted (the caller releases its lease), False if commits kept failing (reopened)."""
        key = (bytes.fromhex(pair[0]), pair[1])
        if key not in self.epochs:
            return False
        self.accepting.discard(key)
        self._restrict_all()
        for _ in range(attempts):
            await asyncio.sleep(0)  # a message queued before the close gets its offset first
            # This partition's messages alone: under load the others are never all committed at once.
            if not self.committer.queues(key) and \
                    self.flusher.committed.get(key, 0) >= self.committer.next_offsets.get(key, 0):
                self.epochs.pop(key, None)
                return True
            if not await self.flusher.flush_round():
                await asyncio.sleep(0.1)
        if key in self.epochs:
            self.accepting.add(key)
            self._restrict_all()
        return False

    def close_all(self) -> None:
        """A stopping node takes no more messages."""
        self.accepting.clear()

    def forget_topic(self, topic_id: bytes) -> None:
        self.unreadable.pop(topic_id.hex(), None)
        for key in [k for k in (*self.epochs, *self.parked) if k[0] == topic_id]:
            self.epochs.pop(key, None)
            self.accepting.discard(key)
            self.parked.pop(key, None)
            self._sending.pop(key, None)
            self._floors.pop(key, None)
            self._handed.pop(key, None)

    def _restrict_all(self) -> None:
        for topic in self._topics().values():
            self._restrict_keyless(topic)

    def _restrict_keyless(self, topic: TopicConfig) -> None:
        topic_id = bytes.fromhex(topic.topic_id)
        self.partitioner.restrict(topic, [p for p in range(topic.partitions) if (topic_id, p) in self.accepting])

    # -- parked items ---------------------------------------------------------------------
    def park(self, items: list[Record | Chunk]) -> None:
        """Keep items of partitions this node does not own (the WAL keeps them too) until it owns them
        again or their owner has committed them."""
        for item in items:
            key = (item.topic_id, item.partition)
            self.parked.setdefault(key, []).append(item)
            self._floors[key] = min(self._floors.get(key, item.offset), item.offset)

    def parked_unowned(self) -> list[PartitionKey]:
        """Parked partitions of live topics this node does not own: their items must reach another node."""
        live = {bytes.fromhex(t.topic_id) for t in self._topics().values()}
        return [key for key in self.parked if key not in self.epochs and key[0] in live]

    def parked_elsewhere(self) -> list[tuple[TopicConfig, int, str]]:
        """Parked partitions another live node owns now: (topic, partition, owner URL)."""
        topics = {bytes.fromhex(t.topic_id): t for t in self._topics().values()}
        out = []
        for key in list(self.parked):
            topic = topics.get(key[0])
            url = None if topic is None or key in self.epochs else self.leases.owner_url((topic.topic_id, key[1]))
            if topic is not None and url is not None and url != self.leases.own_url():
                out.append((topic, key[1], url))
        return out

    def take_parked(self, topic: TopicConfig, partition: int) -> list[Record | Chunk]:
        """A parked partition's items, in offset order, for the router to send to its owner. Until
        `parked_sent` or `parked_unsent` they are on their way: a claim of the partition meanwhile
        takes them back (`adopt`), and the WAL keeps them."""
        key = (bytes.fromhex(topic.topic_id), partition)
        items = sorted(self.parked.pop(key, []), key=lambda i: i.offset)
        if items:
            self._sending[key] = items
        return items

    def parked_unsent(self, topic: TopicConfig, partition: int) -> None:
        """Sending them failed: parked again, unless a claim took them meanwhile."""
        self.park(self._sending.pop((bytes.fromhex(topic.topic_id), partition), []))

    async def parked_sent(self, topic: TopicConfig, partition: int) -> None:
        """The owner committed them (ack=table): the WAL lets them go at once, sealing its active
        segment if they are in it. Until then a restart would hand them on again (recognised by
        their ids, hand_off.py, within the dedup window). If this node claimed the partition
        meanwhile, the claim took them, and found them in the table (the owner committed them before
        its lease ended)."""
        key = (bytes.fromhex(topic.topic_id), partition)
        items = self._sending.pop(key, None)
        if items is None:
            return
        self._handed[key] = max(self._handed.get(key, 0), max(_end(i) for i in items))
        if key not in self.parked:
            self._floors.pop(key, None)
        await asyncio.to_thread(self.wal.seal_if_holding, key)
        self._release_wal()

    def committed_below(self) -> Callable[[PartitionKey], int]:
        """Each partition's committed end, as the WAL's release asks it (or where its items handed
        to another node end); a deleted topic's items are never needed again."""
        live = {bytes.fromhex(t.topic_id) for t in self._topics().values()}
        committed, floors, handed = self.flusher.committed, self._floors, self._handed

        def committed_below(key: PartitionKey) -> int:
            if key[0] not in live:
                return _NEVER
            done = max(committed.get(key, 0), handed.get(key, 0))
            floor = floors.get(key)
            return done if floor is None else min(floor, done)

        return committed_below


def _rows(item: Record | Chunk) -> int:
    return 1 if isinstance(item, Record) else item.rows


def _end(item: Record | Chunk) -> int:
    return item.offset + 1 if isinstance(item, Record) else item.end
