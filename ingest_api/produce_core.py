"""The produce core: every front door turns its wire form into one `ProduceRequest` and hands it
here, so the rules run in one order whatever the door (the fast single-message path, the ASGI
routes, REST Proxy v2, the CLI's embedded broker):

    authorize the topic (403) -> admit: sizes, partitions, backlog (admission.py, 413/422/429)
    -> choose partitions (partitioner.py) -> route each partition: this node's, or its owner's,
       never forwarded twice (router.py) -> deduplicate -> append to the WAL's group commit
       -> settle the `ack` (local_produce.py)

A door parses its input and renders the core's answer in its own wire form; it holds no rule.
HTTP doors also check the route's access before reading a body (auth.py), so a caller without
the scope never gets to send one: the same decision the core makes, made early.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from lakebroker.ingest_api.auth import check_scope, check_topic
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.chunks import BatchResults, ColumnarBatch
from lakebroker.ingest_api.forwarding import Caller
from lakebroker.ingest_api.local_produce import OneMessage, ProduceResult
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.not_here import NotOwner
from lakebroker.ingest_api.router import LOCAL, Router
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.tokens import ApiToken, Scope

# The node's own produces (the CLI's embedded broker): nobody else's token is involved.
THIS_NODE = ApiToken(token_id="-", scopes=frozenset({Scope.PRODUCE}), name="this node")


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """One produce, whatever door it came through. `messages` is one message, a list, or a batch
    held as Arrow columns; `principal` is who asks (a token, or OPEN_ACCESS when auth is off);
    `caller` says whether another node forwarded it and which credential goes along if this
    node forwards it in turn."""

    topic: str
    messages: NewMessage | list[NewMessage] | ColumnarBatch
    ack: AckMode
    principal: ApiToken
    caller: Caller = LOCAL


@dataclass(slots=True)
class BatchAnswer:
    results: BatchResults | list[ProduceResult]  # in request order
    forwarded_to: list[str] = field(default_factory=list)  # owners some of the messages were forwarded to


class ProduceCore:
    def __init__(self, broker: Broker, router: Router | None) -> None:
        """`router`: None for a broker with no peers to forward to (the CLI's embedded one)."""
        self.broker = broker
        self.router = router

    def authorize(self, request: ProduceRequest) -> None:
        """The first rule: the principal may produce, to this topic (Forbidden, 403)."""
        check_scope(request.principal, Scope.PRODUCE)
        check_topic(request.principal, request.topic)

    # -- one message --------------------------------------------------------------------
    async def produce_one(self, request: ProduceRequest) -> ProduceResult:
        assert isinstance(request.messages, NewMessage)
        self.authorize(request)
        try:
            return await self.broker.local.produce_one(request.topic, request.messages, request.ack)
        except NotOwner as refusal:
            return await self._forward_one(request, request.messages, refusal)

    def start_one(self, request: ProduceRequest, then: Callable[[], None] | None,
                  ) -> OneMessage | Coroutine[Any, Any, ProduceResult]:
        """`produce_one` in halves that never wait (the fast path below ASGI): the queued message,
        which `finish_one` (ack none and wal, once `then` was called) or `settle_one` (ack=table)
        answers; or, for another node's partition, the coroutine that forwards it."""
        assert isinstance(request.messages, NewMessage)
        self.authorize(request)
        try:
            return self.broker.local.start_one(request.topic, request.messages, request.ack, then)
        except NotOwner as refusal:
            return self._forward_one(request, request.messages, refusal)

    def finish_one(self, one: OneMessage) -> ProduceResult:
        return self.broker.local.finish_one(one)

    async def settle_one(self, one: OneMessage) -> ProduceResult:
        return await self.broker.local.settle_one(one)

    async def _forward_one(self, request: ProduceRequest, message: NewMessage, refusal: NotOwner) -> ProduceResult:
        if self.router is None:
            raise refusal
        return await self.router.forward_one(request.topic, message, request.ack, refusal, request.caller)

    # -- many messages ------------------------------------------------------------------
    async def batch_turn(self) -> None:
        """Wait for this loop pass's batch turn: one batch's CPU (its parse, its answers) per pass,
        so single messages run between two batches. A door takes one before parsing a body."""
        await self.broker.batch_turns.wait()

    async def produce_batch(self, request: ProduceRequest) -> BatchAnswer:
        """All of the messages or none: the first broken rule answers for the whole request."""
        assert not isinstance(request.messages, NewMessage)
        self.authorize(request)
        owners: list[str] = []
        results: BatchResults | list[ProduceResult]
        if self.router is not None:
            results = await self.router.produce_batch(request.topic, request.messages, request.ack, request.caller,
                                                      owners)
        elif isinstance(request.messages, ColumnarBatch):
            results = await self.broker.local.produce_columns(request.topic, request.messages, request.ack)
        else:
            results = await self.broker.local.produce(request.topic, request.messages, request.ack)
        await self.batch_turn()  # the answers of a WAL group's batches, one per pass too
        return BatchAnswer(results, owners)

    async def produce_each(self, request: ProduceRequest) -> list[ProduceResult | LakebrokerError]:
        """Message by message, as Kafka's proxies answer: a message that breaks a rule of its own
        (its size, its partition) gets that error in its slot and the others are written. A rule
        of the whole request (authorization, the backlog, an unreachable owner) still answers
        for all of them."""
        assert isinstance(request.messages, list)
        self.authorize(request)
        topic = self.broker.topic(request.topic)
        slots: list[ProduceResult | LakebrokerError | None] = list(
            self.broker.admission.refusals(topic, request.messages))
        fit = [m for m, refusal in zip(request.messages, slots, strict=True) if refusal is None]
        if fit:
            answer = await self.produce_batch(
                ProduceRequest(request.topic, fit, request.ack, request.principal, request.caller))
            assert isinstance(answer.results, list)
            written = iter(answer.results)
            slots = [slot if slot is not None else next(written) for slot in slots]
        return [slot for slot in slots if slot is not None]
