"""Where each message of a produce goes: this node's broker for the partitions it owns, the owning
node for the rest. The produce core (produce_core.py), which every front door hands its request
to, routes through here, so the cluster's rules live in one place:

- partitions are picked once, on the node the producer reached (partitioner.py: a key's murmur2,
  an id's hash, or for other keyless messages a partition this node owns, so they need no hop);
- the messages of other nodes' partitions go to their owners in one forwarded batch per owner,
  with their partitions fixed (forwarding.py), at the same `ack`, and the answers are merged in
  request order, so a producer sees one answer as if one node had served it all;
- a forwarded request is never forwarded again: a node that no longer owns its partition answers
  421 not_owner, which the forwarding node passes on as 503 partition_unavailable (forwarding.py),
  and the producer (or the Python client, which reads /v1/cluster) retries.

A batch spread over several owners is several produces: if one owner fails, the others' messages
are stored and the whole request answers the failure, so a producer retrying it should send ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.chunks import BatchResults, Chunk, ColumnarBatch
from lakebroker.ingest_api.forwarding import Caller, Forwarder, Placed
from lakebroker.ingest_api.hand_off import identified
from lakebroker.ingest_api.local_produce import ProduceResult
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.not_here import NotOwner
from lakebroker.ingest_api.records import Record
from lakebroker.tables.errors import LakebrokerError

# Logged when a node stops with messages only its WAL holds (the soak looks for it in its logs).
STRANDED = ("acknowledged messages of %d partitions other nodes own or will own stay in this node's WAL: "
            "start it again with its data dir to hand them over")
RESEND_BATCH_MESSAGES = 5_000
RESEND_BATCH_BYTES = 8 << 20
STOP_RESEND_S = 15.0  # at shutdown, parked items' last chance to reach their owners (uvicorn waits for this)
LOCAL = Caller()  # this node's own sends: not forwarded by another node, no credential to pass on
log = logging.getLogger(__name__)


class Router:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._forwarder: Forwarder | None = None
        self._authorization: str | None = None
        self._resending: asyncio.Task[None] | None = None

    def start(self, authorization: str | None = None) -> None:
        """`authorization`: this node's own credential, for the messages it sends on by itself."""
        # An owner silent for a lease TTL loses its partitions: the producer retries at the next owner.
        self._forwarder = Forwarder(self.broker.cluster.node, self.broker.settings.ingest_lease_ttl_s,
                                    self.broker.settings.max_request_bytes)
        self._authorization = authorization
        self._resending = asyncio.create_task(self._resend_parked())

    async def stop(self) -> None:
        """At shutdown, parked items go to their owners first (for STOP_RESEND_S at most): a node
        stopped for good must not keep acknowledged messages in its WAL that live owners could take.
        A partition between owners (its owner stopped just before this node) is waited for: a live
        node claims it within a heartbeat or two. The node drains first (Membership.drain), so it
        claims nothing back meanwhile and the partitions go to the nodes that stay."""
        self.broker.cluster.drain()
        if self._resending is not None:
            self._resending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resending
            loop = asyncio.get_running_loop()
            deadline = loop.time() + STOP_RESEND_S
            while self.broker.ownership.parked_unowned() and loop.time() < deadline:
                await self._send_parked(deadline)
                if self.broker.ownership.parked_unowned():
                    await asyncio.sleep(max(0.0, min(self.broker.cluster.heartbeat_s, deadline - loop.time())))
            if left := self.broker.ownership.parked_unowned():
                log.error(STRANDED, len(left))
        if self._forwarder is not None:
            await self._forwarder.close()

    async def _resend_parked(self) -> None:
        """This node's WAL items of partitions another node owns now (it took them before a failover,
        or before a restart found the partition moved): sent to the owner, who gives them new
        offsets, at ack=table, so the WAL keeps them until they are in the owner's table."""
        while True:
            await asyncio.sleep(self.broker.cluster.heartbeat_s)
            await self._send_parked()

    async def _send_parked(self, deadline: float | None = None) -> None:
        """One round; `deadline` (loop time) holds inside it too, not only between rounds."""
        for topic, partition, url in self.broker.ownership.parked_elsewhere():
            items = self.broker.ownership.take_parked(topic, partition)
            if not items:
                continue
            try:
                async with asyncio.timeout_at(deadline):
                    for batch in _batches(items, self.broker.cluster.node):
                        await self.forwarder.batch(url, topic.name, batch, [partition] * len(batch), AckMode.TABLE,
                                                   self._authorization)
            except TimeoutError:  # the WAL keeps what is left
                self.broker.ownership.parked_unsent(topic, partition)
                return
            except LakebrokerError as exc:
                log.warning("%s[%d]: sending %d parked items to %s failed (%s); will retry", topic.name,
                            partition, len(items), url, exc)
                self.broker.ownership.parked_unsent(topic, partition)
                continue
            except BaseException:  # cancelled at shutdown: stop() sends them again
                self.broker.ownership.parked_unsent(topic, partition)
                raise
            log.info("%s[%d]: %d parked messages sent to their owner %s", topic.name, partition,
                     sum(1 if isinstance(i, Record) else i.rows for i in items), url)
            await self.broker.ownership.parked_sent(topic, partition)

    @property
    def forwarder(self) -> Forwarder:
        assert self._forwarder is not None, "Router.start runs once the broker has joined its cluster"
        return self._forwarder

    async def forward_one(self, topic: str, message: NewMessage, ack: AckMode, refusal: NotOwner,
                          caller: Caller) -> ProduceResult:
        """A single message this node refused with `refusal`, produced at its owner instead; or
        the refusal, for a message a node sent here (one hop at most) or of no known owner."""
        if caller.forwarded or refusal.owner_url is None:
            raise refusal
        partition, offset, duplicate, timestamp = await self.forwarder.one(
            refusal.owner_url, topic, message, refusal.partition, ack, caller.authorization)
        return ProduceResult(partition, offset, duplicate, timestamp)

    async def produce_batch(self, topic: str, batch: ColumnarBatch | list[NewMessage], ack: AckMode,
                            caller: Caller = LOCAL, owners: list[str] | None = None,
                            ) -> BatchResults | list[ProduceResult]:
        """A batch: as columns when this node owns every partition it spans, else message by message.
        `owners` gets the URL of each node a part of it was forwarded to."""
        if isinstance(batch, ColumnarBatch):
            try:
                return await self.broker.local.produce_columns(topic, batch, ack)
            except NotOwner:
                if caller.forwarded:
                    raise
                batch = batch.messages()
        return await self.produce(topic, batch, ack, caller, owners)

    async def produce(self, topic_name: str, messages: list[NewMessage], ack: AckMode, caller: Caller = LOCAL,
                      owners: list[str] | None = None) -> list[ProduceResult]:
        broker = self.broker
        topic = broker.topic(topic_name)
        sizes = await broker.admission.admit(topic, messages)  # all of them, before any part is stored anywhere
        partitions = broker.partitioner.each(topic, messages, sizes)
        topic_id = bytes.fromhex(topic.topic_id)
        accepting = broker.ownership.accepting
        remote = [i for i, p in enumerate(partitions) if (topic_id, p) not in accepting]
        if not remote:
            return await broker.local.produce(topic_name, messages, ack, partitions=partitions)
        if caller.forwarded:
            raise broker.ownership.not_here(topic, partitions[remote[0]])
        by_owner: dict[str, list[int]] = {}
        for i in remote:
            refusal = broker.ownership.not_here(topic, partitions[i])
            if not isinstance(refusal, NotOwner) or refusal.owner_url is None:
                raise refusal
            by_owner.setdefault(refusal.owner_url, []).append(i)
        if owners is not None:
            owners.extend(by_owner)
        is_remote = set(remote)
        local = [i for i in range(len(messages)) if i not in is_remote]
        parts = [local, *by_owner.values()] if local else list(by_owner.values())
        jobs: list[Coroutine[Any, Any, Sequence[ProduceResult | Placed]]] = [
            broker.local.produce(topic_name, [messages[i] for i in local], ack,
                                 partitions=[partitions[i] for i in local])
        ] if local else []
        jobs += [self.forwarder.batch(url, topic_name, [messages[i] for i in idx], [partitions[i] for i in idx], ack,
                                      caller.authorization) for url, idx in by_owner.items()]
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        results: list[ProduceResult | None] = [None] * len(messages)
        for idx, outcome in zip(parts, outcomes, strict=True):
            assert not isinstance(outcome, BaseException)
            for i, placed in zip(idx, outcome, strict=True):
                results[i] = placed if isinstance(placed, ProduceResult) else ProduceResult(*placed)
        return [r for r in results if r is not None]


def as_messages(item: Record | Chunk, node: str) -> list[NewMessage]:
    """A WAL item's messages as a producer would send them again, each with an id (hand_off.py)."""
    item = identified(item, node)
    if isinstance(item, Record):
        return [NewMessage(item.value, item.format, item.key, item.headers, None, item.message_id, item.producer_id,
                           item.sequence)]
    return [NewMessage(r["value"], r["format"], r["key"], dict(r["headers"]) if r["headers"] else None, None,
                       r["message_id"], r["producer_id"], r["sequence"]) for r in item.columns.to_pylist()]


def _batches(items: list[Record | Chunk], node: str) -> Iterator[list[NewMessage]]:
    batch: list[NewMessage] = []
    size = 0
    for item in items:
        for m in as_messages(item, node):
            batch.append(m)
            size += len(m.value or b"") + 256
            if len(batch) >= RESEND_BATCH_MESSAGES or size >= RESEND_BATCH_BYTES:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch
