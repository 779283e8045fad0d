"""Single-message produce answered by the HTTP protocol itself, below ASGI.

`POST /v1/topics/{topic}/messages` is the request a producer sends most. Through ASGI it pays for
a task, a scope, receive/send messages and every middleware layer; the HTTP protocol
(ingest_api/http_fast_produce.py) can instead hand such a request here, as its head and then its body
arrive, and write the `Answer` itself. The answers are the ASGI path's, from the same functions
in the same order:

    header limits (431) -> token (401) -> declared body size (413) -> scope and topic (403)
    -> topic (404) -> ack (422) -> [body] -> parse (400/415/422) -> ProduceCore.start_one
    -> [WAL group: its write calls back] -> ProduceCore.finish_one (ack=table: settle_one)

`begin` returns None when it cannot decide without waiting (the token table needs a fresh
read): the protocol then serves the request through ASGI, which awaits that read.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from lakebroker.ingest_api.asgi_route import AsgiRoute
from lakebroker.ingest_api.auth import OPEN_ACCESS, Access, Authenticator, access_rule, bearer_of
from lakebroker.ingest_api.body import media_type, parse_message
from lakebroker.ingest_api.errors import error_response
from lakebroker.ingest_api.forwarding import FORWARDED_BY_BYTES, Caller
from lakebroker.ingest_api.limits import MAX_HEADER_BYTES, MAX_HEADERS, body_timeout, declared_too_large, header_refusal
from lakebroker.ingest_api.local_produce import OneMessage, ProduceResult
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.node import IngestNode
from lakebroker.ingest_api.produce_core import ProduceCore, ProduceRequest
from lakebroker.ingest_api.produce_wire import produce_target, produced
from lakebroker.ingest_api.responses import Answer
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.tokens import ApiToken

PATH = "/v1/topics/{topic}/messages"
_JSON = "application/json"
Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class FastRequest:
    """A request whose head passed every check: what producing it needs once its body is in."""

    topic: str
    query: Mapping[str, str]
    ack: AckMode
    kind: str  # media type of the body
    principal: ApiToken
    caller: Caller  # what forwarding needs: the Authorization to pass on, and whether a node sent it


class FastProduce:
    def __init__(self, node: IngestNode, app: FastAPI) -> None:
        """`app`: the app that serves `node` through ASGI, whose route for PATH declares who may call it."""
        route = next((r for r in app.routes if isinstance(r, AsgiRoute) and r.path == PATH and r.methods == {"POST"}),
                     None)
        if route is None:
            raise RuntimeError(f"the app has no POST {PATH} route to serve fast")
        self.core: ProduceCore = node.core
        self.auth: Authenticator = node.auth
        self.access: Access | None = access_rule(route)
        self.max_request_bytes: int = node.settings.max_request_bytes
        self.body_timeout_s: float = node.settings.body_read_timeout_s
        self.taken = 0  # requests this path answered (the rest went through ASGI)

    def begin(self, topic: str, raw_query: bytes, headers: Headers) -> FastRequest | Answer | None:
        """The checks on a request head: a refusal, the request to finish with its body, or None
        (take the ASGI path: a chunked body or none declared, or a token table to read first)."""
        outcome = self._check(topic, raw_query, headers)
        if outcome is not None:
            self.taken += 1
        return outcome

    def _check(self, topic: str, raw_query: bytes, headers: Headers) -> FastRequest | Answer | None:
        # One pass over the headers for what the checks below read; a refusal is then built by the
        # function that owns it, from the headers again (refusals are rare).
        size = 4 * len(headers)
        content_type = b""
        authorization = b""
        forwarded_by = b""
        largest = -1
        for name, value in headers:
            size += len(name) + len(value)
            if name == b"content-length":
                largest = max(largest, int(value) if value.isdigit() else 0)
            elif name == b"content-type":
                if not content_type:
                    content_type = value
            elif name == b"authorization":
                if not authorization:
                    authorization = value
            elif name == FORWARDED_BY_BYTES:
                if not forwarded_by:
                    forwarded_by = value
            elif name == b"transfer-encoding":
                return None  # a chunked body: uvicorn reads it
        if largest < 0:
            return None  # no declared length (the body ends with the connection): uvicorn reads it
        if len(headers) > MAX_HEADERS or size > MAX_HEADER_BYTES:
            return header_refusal(headers)
        principal: ApiToken = OPEN_ACCESS  # a public route: anyone may produce
        if self.access is not None:
            try:
                known = self.auth.authenticate_now(bearer_of(headers))
            except LakebrokerError as exc:
                return Answer.of(error_response(exc))
            if known is None:
                return None  # the token table needs a read: ASGI awaits it
            principal = known
        if largest > self.max_request_bytes:
            return declared_too_large(headers, self.max_request_bytes)
        try:
            if self.access is not None and principal is not OPEN_ACCESS:
                self.access.authorize(principal, "POST", PATH, topic)  # auth off: every scope, every topic
            query, ack = produce_target(self.core.broker, topic, raw_query)
        except LakebrokerError as exc:
            return Answer.of(error_response(exc))
        kind = _JSON if content_type == b"application/json" else media_type(content_type.decode("latin-1"))
        caller = Caller(authorization.decode("latin-1") or None, bool(forwarded_by))
        return FastRequest(topic, query, ack, kind, principal, caller)

    def start(self, request: FastRequest, body: bytes,
              then: Callable[[], None]) -> Answer | OneMessage | Coroutine[Any, Any, Answer]:
        """The body parsed and the message queued: its answer, or what it waits for. At ack=wal and
        ack=none `then` is called on the loop once `finish` can answer; ack=table takes `settle`. A message of another
        node's partition is forwarded there: the coroutine that does it answers."""
        try:
            message = parse_message(request.kind, request.query, body)
            one = self.core.start_one(
                ProduceRequest(request.topic, message, request.ack, request.principal, request.caller),
                None if request.ack is AckMode.TABLE else then)
        except LakebrokerError as exc:
            return Answer.of(error_response(exc))
        if not isinstance(one, OneMessage):
            return self._forwarded(one, request.ack)
        if one.ack is not AckMode.TABLE and not one.waits():
            return self.finish(one)
        return one

    def finish(self, one: OneMessage) -> Answer:
        """The answer once `one` waits no more (ack none or wal)."""
        try:
            result = self.core.finish_one(one)
        except LakebrokerError as exc:
            return Answer.of(error_response(exc))
        return produced(result, one.ack)

    async def settle(self, one: OneMessage) -> Answer:
        try:
            result = await self.core.settle_one(one)
        except LakebrokerError as exc:
            return Answer.of(error_response(exc))
        return produced(result, one.ack)

    @staticmethod
    async def _forwarded(forwarding: Coroutine[Any, Any, ProduceResult], ack: AckMode) -> Answer:
        try:
            result = await forwarding
        except LakebrokerError as exc:
            return Answer.of(error_response(exc))
        return produced(result, ack)

    def timed_out(self) -> Answer:
        """The body did not arrive within body_read_timeout_s: BodyLimit's 408."""
        return Answer.of(error_response(body_timeout(self.body_timeout_s)))
