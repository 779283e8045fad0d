"""Produce to the partitions this node owns: admitted, partitioned, deduplicated, appended to the
WAL's group commit, and answered at the producer's `ack`.

Three shapes of one rule set: a list of messages (`produce`), one message in two halves that never
wait on their own (`start_one` / `finish_one`, for the fast path below ASGI), and a batch held as
Arrow columns (`produce_columns`, columnar_produce.py). A message of a partition this node does not
take now is refused (ownership.py) before any message of the request is queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from lakebroker.ingest_api.acks import Acks, highest_offsets
from lakebroker.ingest_api.admission import Admission
from lakebroker.ingest_api.chunks import BatchResults, ColumnarBatch
from lakebroker.ingest_api.columnar_produce import ColumnarProduce
from lakebroker.ingest_api.dedup import DedupIndex, DedupKey, Placed, dedup_id, remember_placed
from lakebroker.ingest_api.group_commit import GroupCommitter, Pending
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.ownership import Ownership
from lakebroker.ingest_api.partitioner import Partitioner
from lakebroker.ingest_api.records import RECORD_OVERHEAD, Record
from lakebroker.ingest_api.sequences import SequenceMarks
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.topics import TopicConfig

_NONE, _TABLE = AckMode.NONE, AckMode.TABLE  # a member lookup costs the hot path ~0.3 µs on Python 3.11


@dataclass(slots=True)
class ProduceResult:
    partition: int
    offset: int | None
    duplicate: bool = False
    timestamp_us: int | None = None  # log-append time; None while the offset is


@dataclass(slots=True)
class OneMessage:
    """A single message `LocalProduce.start_one` took: what `finish_one` needs to answer it."""

    topic: str
    topic_id: bytes
    ack: AckMode
    started: float  # perf_counter, for the latency metric
    result: ProduceResult  # so far
    queued: Pending | None  # its WAL record; None for a duplicate
    original: asyncio.Future[Placed] | None  # a duplicate of a message in flight: that message's placement

    def waits(self) -> bool:
        """True until `finish_one` can answer: with ack=none, only until the end of the loop pass
        that queued it, where the group committer calls its `then` (if it has one)."""
        if self.ack is _NONE:
            return self.queued is not None and self.queued.then is not None
        if self.queued is not None:
            return self.queued.outcome is None
        return self.original is not None and not self.original.done()


class LocalProduce:
    def __init__(self, *, topic: Callable[[str], TopicConfig], admission: Admission, partitioner: Partitioner,
                 ownership: Ownership, dedup: DedupIndex, marks: SequenceMarks, committer: GroupCommitter,
                 acks: Acks) -> None:
        self.topic = topic  # a topic by name, or NotFound
        self.admission = admission
        self.partitioner = partitioner
        self.ownership = ownership
        self.dedup = dedup
        self.committer = committer
        self.acks = acks
        self.columnar = ColumnarProduce(admission=admission, partitioner=partitioner, ownership=ownership,
                                        dedup=dedup, marks=marks, committer=committer, acks=acks)
        self._topic_ids: dict[str, bytes] = {}  # a topic id's bytes, for the single-message path

    def forget(self, topic: TopicConfig) -> None:
        self._topic_ids.pop(topic.topic_id, None)

    async def produce(self, topic_name: str, messages: list[NewMessage], ack: AckMode,
                      partitions: list[int] | None = None) -> list[ProduceResult]:
        """`partitions`: the ones ingest_api/router.py picked, having admitted the messages already
        (else admitted and picked here)."""
        topic = self.topic(topic_name)
        sizes = await self.admission.admit(topic, messages) if partitions is None else []
        started = time.perf_counter()
        topic_id = bytes.fromhex(topic.topic_id)
        results: list[ProduceResult] = []
        waits: list[tuple[int, asyncio.Future[Placed]]] = []
        pending: list[Pending] = []
        if partitions is None:
            partitions = self.partitioner.each(topic, messages, sizes)
        self.ownership.check_open(topic, topic_id, set(partitions))
        for i, m in enumerate(messages):
            result, queued, original = self._place(topic, topic_id, m, partitions[i], awaited=ack is not _NONE)
            results.append(result)
            if queued is not None:
                pending.append(queued)
            future = original if queued is None else queued.future
            if future is not None:
                waits.append((i, future))
        if pending:
            self.committer.submit(pending)
        self.acks.queued(topic.name, ack, len(pending))
        if ack is _NONE:
            for i, future in waits:
                if results[i].duplicate and future.done() and not future.exception():
                    p, o, ts = future.result()
                    results[i] = ProduceResult(p, o, True, ts)
            return results
        await asyncio.gather(*(f for _, f in waits), return_exceptions=True)
        for i, future in waits:
            p, o, ts = future.result()  # re-raises StorageUnavailable for a group that failed
            results[i] = ProduceResult(p, o, results[i].duplicate, ts)
        if ack is _TABLE:
            await self.acks.in_table(topic_id, highest_offsets((r.partition, r.offset or 0) for r in results))
        self.acks.answered(topic.name, ack, started, sum(1 for r in results if r.duplicate))
        return results

    async def produce_one(self, topic_name: str, message: NewMessage, ack: AckMode) -> ProduceResult:
        """`produce` of one message: the same answer, metrics and WAL record, with no lists."""
        return await self.settle_one(self.start_one(topic_name, message, ack))

    async def settle_one(self, one: OneMessage) -> ProduceResult:
        """The second half of `produce_one`: waits for the WAL group (and with ack=table the Delta commit)."""
        if one.waits():
            future = one.original if one.queued is None else one.queued.future
            assert future is not None, "start_one gives an awaited message a future"
            with contextlib.suppress(LakebrokerError):  # finish_one raises it
                await future
        result = self.finish_one(one)
        if one.ack is _TABLE:
            assert result.offset is not None
            await self.acks.in_table(one.topic_id, {result.partition: result.offset})
            self.acks.timed(one.ack, one.started)
        return result

    def start_one(self, topic_name: str, message: NewMessage, ack: AckMode,
                  then: Callable[[], None] | None = None) -> OneMessage:
        """The first half of `produce_one`, which never waits: the message validated, deduplicated and
        queued for the WAL. `finish_one` answers it once `waits()` is false: a caller that gives `then`
        has it called on the loop at that moment (no future, no task): for ack=wal once its WAL write
        is durable, for ack=none at the end of the loop pass; others await `settle_one`, as ack=table must."""
        topic = self.topic(topic_name)
        size = self.admission.check_one(topic, message)
        started = time.perf_counter()
        topic_id = self._topic_ids.get(topic.topic_id) or self._topic_id(topic)
        partition = self.partitioner.one(topic, message)
        if (topic_id, partition) not in self.ownership.accepting:
            raise self.ownership.not_here(topic, partition)
        result, queued, original = self._place(topic, topic_id, message, partition,
                                               awaited=then is None and ack is not _NONE, size=size)
        if queued is not None:
            queued.then = then
            queued.early = ack is _NONE
            self.committer.submit_one(queued)
        elif then is not None and ack is not _NONE and original is not None and not original.done():
            original.add_done_callback(lambda _: then())
        # (`ack` is a str: it labels metrics as `ack.value` does, without the enum's slow property.)
        self.acks.queued(topic.name, ack, 0 if queued is None else 1)
        return OneMessage(topic.name, topic_id, ack, started, result, queued, original)

    def finish_one(self, one: OneMessage) -> ProduceResult:
        """`start_one`'s result once it waits no more; raises StorageUnavailable for a failed group."""
        original = one.original
        if one.ack is _NONE:
            if original is not None and original.done() and not original.exception():
                p, o, ts = original.result()
                return ProduceResult(p, o, True, ts)
            return one.result
        if one.queued is not None:
            outcome = one.queued.outcome
            if isinstance(outcome, LakebrokerError):
                raise outcome
            assert outcome is not None, "finish_one before the message's group was written"
            result = ProduceResult(outcome[0], outcome[1], False, outcome[2])
        elif original is not None:
            p, o, ts = original.result()  # re-raises the original's StorageUnavailable
            result = ProduceResult(p, o, True, ts)
        else:
            result = one.result  # a duplicate of a message already durable
        self.acks.answered(one.topic, one.ack, one.started, 1 if result.duplicate else 0, timed=one.ack is not _TABLE)
        return result

    def _place(self, topic: TopicConfig, topic_id: bytes, m: NewMessage, partition: int, awaited: bool,
               size: int = -1) -> tuple[ProduceResult, Pending | None, asyncio.Future[Placed] | None]:
        """One message's result so far, what it queues for the WAL (None: a duplicate), and for a
        duplicate of a message still in flight, that message's future (it waits for it). A queued
        message gets a future if it is `awaited` or carries an id (later sends of the id wait on it).
        `partition` was picked before the dedup check, so a duplicate takes its turn in the keyless
        runs on every produce path alike."""
        did = dedup_id(m.message_id, m.producer_id, m.sequence, partition)
        key: DedupKey | None = None if did is None else (topic.topic_id, did)
        if key is not None:
            hit = self.dedup.lookup(key)
            if isinstance(hit, tuple):
                return ProduceResult(hit[0], hit[1], True, hit[2]), None, None
            if hit is not None:
                return ProduceResult(-1, None, duplicate=True), None, hit
        record = Record(topic.name, topic_id, partition, -1, 0, m.key, m.value, m.format, m.headers,
                        m.message_id, m.producer_id, m.sequence, -1 if size < 0 else RECORD_OVERHEAD + size)
        future: asyncio.Future[Placed] | None = None
        if awaited or key is not None:
            future = asyncio.get_running_loop().create_future()
            if key is not None:
                self.dedup.begin(key, future)
                future.add_done_callback(remember_placed(self.dedup, key))
        return ProduceResult(partition, None), Pending(record, future), None

    def _topic_id(self, topic: TopicConfig) -> bytes:
        topic_id = self._topic_ids[topic.topic_id] = bytes.fromhex(topic.topic_id)
        return topic_id

    async def produce_columns(self, topic_name: str, batch: ColumnarBatch, ack: AckMode) -> BatchResults:
        """`produce` for a batch held as columns (columnar_produce.py)."""
        return await self.columnar.produce(self.topic(topic_name), batch, ack)
