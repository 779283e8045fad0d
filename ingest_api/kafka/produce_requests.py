"""Kafka's Produce request through the produce core: each topic's partitions decoded in one pass
(record_batches.py) and handed to the core as one columnar batch, each row with its partition;
the answers per partition in Kafka's shape.

A rule that refuses one partition alone (another node owns it, it does not exist) would refuse
the whole batch, so on such a refusal each partition goes to the core again by itself, and only
the partitions the rule is about are refused. A rule about the topic or the request
(authorization, the backlog) answers for each of its partitions."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from kio.schema.errors import ErrorCode
from prometheus_client import Counter

from lakebroker.ingest_api.chunks import BatchResults, ColumnarBatch
from lakebroker.ingest_api.forwarding import Caller
from lakebroker.ingest_api.kafka import record_batches, wire
from lakebroker.ingest_api.kafka.errors import error_code
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.metrics import Children
from lakebroker.ingest_api.not_here import NoOwnerYet, NotOwner
from lakebroker.ingest_api.produce_core import ProduceCore, ProduceRequest
from lakebroker.ingest_api.sequences import OutOfOrderSequence
from lakebroker.tables.errors import Backpressure, LakebrokerError, NoSuchPartition, NotFound
from lakebroker.tables.tokens import ApiToken

log = logging.getLogger(__name__)
T = TypeVar("T")

PRODUCE = 0
FORWARDED = Caller(None, forwarded=True)  # a Kafka client finds the owner itself: never forward
# refusals about one partition, not its topic
_PER_PARTITION = (NotOwner, NoOwnerYet, NoSuchPartition, OutOfOrderSequence)
_EXPECTED = (*_PER_PARTITION, NotFound, Backpressure)  # refusals a client meets in normal use: not logged


Decoded = tuple[int, int, list[record_batches.Batch]]  # a partition's place in its topic's list, index, batches


@dataclass(frozen=True, slots=True)
class Answer:
    """A partition's answer: its error, its first offset, and how long the client should wait
    before it sends again (backpressure)."""

    error: ErrorCode
    base_offset: int = -1
    throttle_s: float = 0.0


class ProduceRequests:
    def __init__(self, core: ProduceCore, acks_all: AckMode, partition_errors: Children[Counter]) -> None:
        self.core = core
        self.acks_all = acks_all  # what acks=all (-1) waits for
        self.max_request_bytes = core.broker.settings.max_request_bytes
        self._partition_errors = partition_errors

    async def answer(self, principal: ApiToken | None, request: wire.Request, queued: asyncio.Event) -> bytes | None:
        """The request's answer (None for acks=0). `queued` is set once every partition's records
        are queued for the WAL or refused: the connection's next request may go to the core then,
        and its records land after these. `principal` is None when the connection may not produce."""
        body = request.body
        places = [(t.name, p.index) for t in body.topic_data for p in t.partition_data]
        if body.transactional_id is not None:
            answers = [Answer(ErrorCode.transactional_id_authorization_failed)] * len(places)
            ack = AckMode.WAL
            queued.set()
        else:
            ack = {0: AckMode.NONE, 1: AckMode.WAL}.get(body.acks, self.acks_all)
            assert principal is not None
            each = [functools.partial(self._topic, principal, t.name, [(p.index, p.records) for p in t.partition_data],
                                      ack) for t in body.topic_data]
            answers = [a for topic in await in_order(each, queued) for a in topic]
        if ack is AckMode.NONE:
            return None
        return wire.frame_of(request, self._rendered(request, places, answers))

    def _rendered(self, request: wire.Request, places: list[tuple[str, int]], answers: list[Answer]) -> Any:
        schema = wire.response_schema(PRODUCE, request.version)
        topic_entry = wire.nested(schema, "TopicProduceResponse")
        partition_entry = wire.nested(schema, "PartitionProduceResponse")
        by_topic: dict[str, list[Any]] = {}
        for (name, index), answer in zip(places, answers, strict=True):
            if answer.error is not ErrorCode.none:
                self._partition_errors("Produce", answer.error.name.upper()).inc()
            by_topic.setdefault(name, []).append(wire.build(
                partition_entry, index=index, error_code=answer.error, base_offset=answer.base_offset,
                log_start_offset=-1, record_errors=(), error_message=None, log_append_time=None))
        topics = tuple(wire.build(topic_entry, name=name, partition_responses=tuple(parts))
                       for name, parts in by_topic.items())
        # Backpressure: Kafka's quota answer, which clients honour by pausing before they send again
        throttle = timedelta(seconds=max((a.throttle_s for a in answers), default=0.0))
        return wire.build(schema, responses=topics, throttle_time=throttle)

    async def _topic(self, principal: ApiToken, topic: str, partitions: list[tuple[int, bytes | None]],
                     ack: AckMode, queued: asyncio.Event) -> list[Answer]:
        """A topic's partitions, in the order asked; `queued` as for `answer`."""
        answers: dict[int, Answer] = {}  # by place in the request
        decoded: list[Decoded] = []
        for place, (partition, records) in enumerate(partitions):
            try:
                if not records:
                    raise record_batches.CorruptBatch("no records")
                decoded.append((place, partition, record_batches.batches(records, self.max_request_bytes)))
            except LakebrokerError as exc:
                answers[place] = self._refused(topic, partition, exc)
        try:
            if decoded:
                answers.update(await self._produce(principal, topic, decoded, ack, queued))
        finally:
            queued.set()
        return [answers[place] for place in range(len(partitions))]

    async def _produce(self, principal: ApiToken, topic: str, decoded: list[Decoded], ack: AckMode,
                       queued: asyncio.Event) -> dict[int, Answer]:
        """The decoded partitions as one batch; each again by itself when a rule refuses one partition."""
        try:
            try:
                columns = record_batches.columns([b for _, _, found in decoded for b in found])
            except LakebrokerError:
                if len(decoded) == 1:
                    raise
                return await self._one_by_one(principal, topic, decoded, ack, queued)
            counts = [sum(b.count for b in found) for _, _, found in decoded]
            explicit = pa.array(np.repeat(np.array([p for _, p, _ in decoded], np.int64), counts))
            answer = await self.core.produce_batch(ProduceRequest(
                topic, ColumnarBatch.of(columns, explicit, queued, consecutive=True), ack, principal, FORWARDED))
        except _PER_PARTITION as exc:
            if len(decoded) > 1 and not queued.is_set():  # refused before any record was queued
                return await self._one_by_one(principal, topic, decoded, ack, queued)
            return {place: self._refused(topic, partition, exc) for place, partition, _ in decoded}
        except LakebrokerError as exc:  # about the topic or the request: every partition's answer
            return {place: self._refused(topic, partition, exc) for place, partition, _ in decoded}
        assert isinstance(answer.results, BatchResults)
        firsts = np.cumsum([0, *counts[:-1]])
        return {place: Answer(ErrorCode.none, int(answer.results.offset[first]))
                for (place, _, _), first in zip(decoded, firsts.tolist(), strict=True)}

    async def _one_by_one(self, principal: ApiToken, topic: str, decoded: list[Decoded], ack: AckMode,
                          queued: asyncio.Event) -> dict[int, Answer]:
        steps = [functools.partial(self._produce, principal, topic, [one], ack) for one in decoded]
        return {place: a for answers in await in_order(steps, queued) for place, a in answers.items()}

    def _refused(self, topic: str, partition: int, exc: LakebrokerError) -> Answer:
        if not isinstance(exc, _EXPECTED):
            log.warning("Kafka produce to %s[%d] refused: %s", topic, partition, exc.message)
        return Answer(error_code(exc), -1, exc.retry_after_s if isinstance(exc, Backpressure) else 0.0)


async def in_order(steps: Sequence[Callable[[asyncio.Event], Awaitable[T]]], queued: asyncio.Event) -> list[T]:
    """Run `steps` concurrently, but each starts once the one before it has queued its records
    (set the event it was given) or ended: records of one request keep their order. `queued` is
    set once every step has; then their results, in order."""
    if len(steps) == 1:  # one topic, as most requests are: no task of its own to wait beside
        try:
            return [await steps[0](queued)]
        finally:
            queued.set()
    tasks: list[asyncio.Task[T]] = []
    try:
        for step in steps:
            mine = asyncio.Event()
            task = asyncio.ensure_future(step(mine))
            tasks.append(task)
            await queued_or_done(mine, task)
    finally:
        queued.set()
    return list(await asyncio.gather(*tasks))


async def queued_or_done(queued: asyncio.Event, task: asyncio.Future[Any]) -> None:
    """Wait until `task` has queued its records (set `queued`) or ended, whichever comes first."""
    if queued.is_set() or task.done():
        return
    waiting = asyncio.create_task(queued.wait())
    try:
        await asyncio.wait((task, waiting), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
