"""Kafka's Fetch and ListOffsets: a partition's committed records (fetch.py reads them from its
table) and its offsets by time, with Fetch's long poll on the flusher's commits.

A consumer reads a partition from its owner: another node's partition is NOT_LEADER_OR_FOLLOWER,
and the client finds the owner in the metadata."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode
from prometheus_client import Counter

from lakebroker.ingest_api.auth import check_scope, check_topic
from lakebroker.ingest_api.kafka import wire
from lakebroker.ingest_api.kafka.errors import error_code
from lakebroker.ingest_api.kafka.fetch import TopicReads
from lakebroker.ingest_api.metrics import Children
from lakebroker.ingest_api.not_here import NoOwnerYet, NotOwner
from lakebroker.ingest_api.produce_core import ProduceCore
from lakebroker.ingest_api.reader import offset_for_timestamp
from lakebroker.ingest_api.wal import PartitionKey
from lakebroker.tables.errors import Forbidden, LakebrokerError, NoSuchPartition, NotFound
from lakebroker.tables.tokens import ApiToken, Scope
from lakebroker.tables.topics import TopicConfig

log = logging.getLogger(__name__)

FETCH, LIST_OFFSETS = 1, 2
EARLIEST, LATEST = -2, -1  # ListOffsets' timestamps that ask for the log start and the log end
_ZERO = timedelta(0)


@dataclass(frozen=True, slots=True)
class _Fetched:
    """One partition's Fetch answer, and what to wait for when it has nothing yet."""

    error: ErrorCode
    end: int  # the high watermark: the committed end
    start: int  # the log start
    records: bytes = b""
    wait: tuple[PartitionKey, int] | None = None


class FetchRequests:
    def __init__(self, core: ProduceCore, partition_errors: Children[Counter]) -> None:
        self.core = core
        self.reads = TopicReads(core.broker.layout)
        self._partition_errors = partition_errors

    async def answer(self, principal: ApiToken, request: wire.Request) -> bytes:
        if request.api_key == FETCH:
            return await self._fetch(principal, request)
        return await self._list_offsets(principal, request)

    def _readable(self, principal: ApiToken, name: str, partition: int) -> tuple[TopicConfig, PartitionKey]:
        """The topic and partition key a consumer may read here: Forbidden without the consume
        scope or the topic, NotFound / NoSuchPartition, NotOwner when another node owns it."""
        check_scope(principal, Scope.CONSUME)
        check_topic(principal, name)
        topic = self.core.broker.topic(name)
        topic.check_partition(partition)
        key = (bytes.fromhex(topic.topic_id), partition)
        if key not in self.core.broker.ownership.epochs:
            raise self.core.broker.ownership.not_here(topic, partition)
        return topic, key

    async def _fetch(self, principal: ApiToken, request: wire.Request) -> bytes:
        body = request.body
        schema = wire.response_schema(FETCH, request.version)
        topic_entry, partition_entry = wire.nested(schema, "FetchableTopicResponse"), wire.nested(schema,
                                                                                                  "PartitionData")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + body.max_wait.total_seconds()
        asked = [(t.topic, p) for t in body.topics for p in t.partitions]
        while True:
            answers, waits, size = [], [], 0
            for name, p in asked:
                answer = await self._fetch_partition(principal, name, p, max(0, body.max_bytes - size))
                answers.append(answer)
                size += len(answer.records)
                if answer.wait is not None:
                    waits.append(answer.wait)
            remaining = deadline - loop.time()
            if size >= body.min_bytes or remaining <= 0 or not waits or len(waits) < len(asked):
                break
            # Long poll: until a commit brings any asked partition a record, or max_wait is up.
            futures = [self.core.broker.flusher.wait_committed(*wait) for wait in waits]
            try:
                await asyncio.wait(futures, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for future in futures:
                    future.cancel()
        by_topic: dict[str, list[Any]] = {}
        for (name, p), answer in zip(asked, answers, strict=True):
            if answer.error is not ErrorCode.none:
                self._partition_errors("Fetch", answer.error.name.upper()).inc()
            by_topic.setdefault(name, []).append(wire.build(
                partition_entry, partition_index=p.partition, error_code=answer.error, high_watermark=answer.end,
                last_stable_offset=answer.end, log_start_offset=answer.start, aborted_transactions=None,
                preferred_read_replica=-1, records=answer.records))
        topics = tuple(wire.build(topic_entry, topic=name, partitions=tuple(parts)) for name, parts in by_topic.items())
        return wire.frame_of(request, wire.build(schema, throttle_time=_ZERO, error_code=ErrorCode.none, session_id=0,
                                                 responses=topics))

    async def _fetch_partition(self, principal: ApiToken, name: str, p: Any, budget: int) -> _Fetched:
        try:
            topic, key = self._readable(principal, name, p.partition)
            end = self.core.broker.committed_end(topic, p.partition)
            if p.fetch_offset > end:
                start = await asyncio.to_thread(self.reads.log_start, topic, p.partition, end)
                return _Fetched(ErrorCode.offset_out_of_range, end, start)
            if p.fetch_offset == end:  # caught up: nothing yet, a wait for the next commit
                start = await asyncio.to_thread(self.reads.log_start, topic, p.partition, end)
                return _Fetched(ErrorCode.none, end, start, wait=(key, p.fetch_offset))
            if budget <= 0:  # the response is full: this partition's records wait for the next Fetch
                return _Fetched(ErrorCode.none, end, await asyncio.to_thread(self.reads.log_start, topic,
                                                                             p.partition, end))
            read = await asyncio.to_thread(self.reads.read, topic, p.partition, p.fetch_offset, end,
                                           min(p.partition_max_bytes, budget),
                                           self.core.broker.ownership.epochs.get(key, -1))
            if p.fetch_offset < read.log_start:
                return _Fetched(ErrorCode.offset_out_of_range, end, read.log_start)
            return _Fetched(ErrorCode.none, end, read.log_start, read.records)
        except LakebrokerError as exc:
            if not isinstance(exc, NotOwner | NoOwnerYet | NotFound | NoSuchPartition | Forbidden):
                log.warning("Kafka fetch from %s[%d] refused: %s", name, p.partition, exc.message)
            return _Fetched(error_code(exc), -1, -1)

    async def _list_offsets(self, principal: ApiToken, request: wire.Request) -> bytes:
        schema = wire.response_schema(LIST_OFFSETS, request.version)
        topic_entry = wire.nested(schema, "ListOffsetsTopicResponse")
        partition_entry = wire.nested(schema, "ListOffsetsPartitionResponse")
        topics = []
        for t in request.body.topics:
            parts = []
            for p in t.partitions:
                error, offset, timestamp, epoch = ErrorCode.none, -1, -1, -1
                try:
                    topic, key = self._readable(principal, t.name, p.partition_index)
                    epoch = self.core.broker.ownership.epochs.get(key, -1)
                    end = self.core.broker.committed_end(topic, p.partition_index)
                    if p.timestamp == LATEST:
                        offset = end
                    elif p.timestamp == EARLIEST:
                        offset = await asyncio.to_thread(self.reads.log_start, topic, p.partition_index, end)
                    elif p.timestamp >= 0:
                        found = await asyncio.to_thread(offset_for_timestamp, self.core.broker.layout, topic,
                                                        p.partition_index, p.timestamp * 1000)
                        offset, timestamp = (-1, -1) if found is None or found >= end else (found, p.timestamp)
                    else:
                        error = ErrorCode.invalid_request
                except LakebrokerError as exc:
                    error = error_code(exc)
                parts.append(wire.build(partition_entry, partition_index=p.partition_index, error_code=error,
                                        timestamp=timestamp, offset=offset, leader_epoch=epoch,
                                        old_style_offsets=()))
            topics.append(wire.build(topic_entry, name=t.name, partitions=tuple(parts)))
        return wire.frame_of(request, wire.build(schema, throttle_time=_ZERO, topics=tuple(topics)))
