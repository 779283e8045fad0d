"""Messages sent on to their partition's owner: a JSON batch over pooled keep-alive connections.

Every message goes with its partition fixed, so the owner places it exactly where this node
decided, and with its id, producer id and sequence, so the owner deduplicates it. The caller's
Authorization header goes along: tokens are the cluster's (one `_system/tokens` table), and the
owner checks the caller's scopes and topics again. A forwarded request carries FORWARDED_BY, and
a node never forwards such a request again: one hop at most, whatever the owners did meanwhile.

Each owner has a pool of its own, so one that accepts connections and never answers (paused, or
stuck) holds only its own; and a forward waits one lease TTL at most: an owner silent that long
has lost its partitions, or will within a heartbeat, and the producer retries.

Single messages (`Forwarder.one`) share requests: those for one owner, topic, `ack` and caller's
credential go together, as a Kafka producer's records for one broker do. A message is sent at once
while fewer than SENDS_IN_FLIGHT such requests are under way, else with the others that arrive
before one of them returns. Under load a forwarded message then costs the owner a share of one
request rather than a request of its own, and an idle producer waits for nothing. The owner answers
each message's placement; a refusal of the whole request (the partitions moved, backpressure, the
owner gone) is every message's answer, as it would have been alone.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson

from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.not_here import NoOwnerYet
from lakebroker.tables.errors import LakebrokerError

FORWARDED_BY = "lakebroker-forwarded-by"
FORWARDED_BY_BYTES = FORWARDED_BY.encode()
Placed = tuple[int, int | None, bool, int | None]  # partition, offset, duplicate, timestamp (µs)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
OWNER_CONNECTIONS = 64  # per owner
SENDS_IN_FLIGHT = 2  # shared requests under way per owner, topic, ack and credential, before messages wait
SHARED_MESSAGES = 1_000  # at most in one shared request
SHARED_BYTES = 1 << 20  # its body at most (and the owner's max_request_bytes), unless one message is larger


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a produce, as far as forwarding cares: the Authorization header that goes along to an
    owner, and whether a node sent it (then it is refused where it is not owned, never sent on)."""

    authorization: str | None = None
    forwarded: bool = False

    @classmethod
    def of(cls, header: Callable[[bytes], str | None]) -> Caller:
        """The caller of a request whose headers `header` reads (by lower-case name, None if absent)."""
        return cls(header(b"authorization") or None, bool(header(FORWARDED_BY_BYTES)))


class Refused(LakebrokerError):
    """The owner's refusal, passed on with its status, code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def message_json(m: NewMessage, partition: int) -> dict[str, Any]:
    """A message as the batch body carries it, its value in its format (json, text or binary)."""
    out: dict[str, Any] = {"partition": partition}
    if m.key is not None:
        out["key"] = m.key
    if m.value is None:
        out["value"] = None
    elif m.format == "json":
        out["value"] = orjson.Fragment(m.value)
    elif m.format == "text":
        out["value"] = m.value.decode()
    else:
        out["value_b64"] = base64.b64encode(m.value).decode()
    if m.headers:
        out["headers"] = m.headers
    if m.message_id is not None:
        out["id"] = m.message_id
    if m.producer_id is not None:
        out["producer_id"] = m.producer_id
    if m.sequence is not None:
        out["sequence"] = m.sequence
    return out


SharedKey = tuple[str, str, AckMode, str | None]  # owner URL, topic, ack, Authorization
_HEAD, _TAIL = b'{"messages":[', b"]}"


@dataclass(slots=True)
class _Shared:
    """Single messages waiting to share a request to one owner."""

    bodies: list[bytes] = field(default_factory=list)  # each message as the batch body carries it
    waiters: list[asyncio.Future[Placed]] = field(default_factory=list)
    size: int = 0
    in_flight: int = 0


class Forwarder:
    def __init__(self, node: str, timeout_s: float, max_request_bytes: int = SHARED_BYTES) -> None:
        """`timeout_s`: the whole forward's deadline, waiting for a connection included (the lease TTL);
        `max_request_bytes`: the owners' body limit (every node's settings alike), which bounds a shared request."""
        self.node = node
        self.timeout_s = timeout_s
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._shared_bytes = min(SHARED_BYTES, max_request_bytes)
        self._shared: dict[SharedKey, _Shared] = {}
        self._sends: set[asyncio.Task[None]] = set()
        self._closing = False

    def _client(self, url: str) -> httpx.AsyncClient:
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=min(5.0, self.timeout_s)),
                limits=httpx.Limits(max_connections=OWNER_CONNECTIONS, max_keepalive_connections=32,
                                    keepalive_expiry=30),
            )
        return client

    async def close(self) -> None:
        self._closing = True
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        for client in self._clients.values():
            await client.aclose()

    async def one(self, url: str, topic: str, message: NewMessage, partition: int, ack: AckMode,
                  authorization: str | None) -> Placed:
        """Produce one message at `partition` through the owner at `url`, in a request it may share."""
        key = (url, topic, ack, authorization)
        shared = self._shared.get(key)
        if shared is None:
            shared = self._shared[key] = _Shared()
        body = orjson.dumps(message_json(message, partition))
        if shared.bodies and len(_HEAD) + shared.size + len(body) + len(_TAIL) > self._shared_bytes:
            self._send(key, shared)  # full: what waits goes now, this message starts the next request
        waiter: asyncio.Future[Placed] = asyncio.get_running_loop().create_future()
        shared.bodies.append(body)
        shared.waiters.append(waiter)
        shared.size += len(body) + 1  # and a comma
        if shared.in_flight < SENDS_IN_FLIGHT or len(shared.bodies) >= SHARED_MESSAGES:
            self._send(key, shared)
        try:  # one lease TTL from now, whether it waited to be sent or not (the waiter is then cancelled)
            return await asyncio.wait_for(waiter, self.timeout_s)
        except TimeoutError:
            raise self._silent(url) from None

    def _send(self, key: SharedKey, shared: _Shared) -> None:
        # A message whose producer has had its answer (a timeout, or it went away) is not sent.
        kept = [(b, w) for b, w in zip(shared.bodies, shared.waiters, strict=True) if not w.done()]
        shared.bodies, shared.waiters, shared.size = [], [], 0
        if not kept:
            return
        bodies, waiters = [b for b, _ in kept], [w for _, w in kept]
        shared.in_flight += 1
        task = asyncio.create_task(self._send_shared(key, shared, bodies, waiters))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send_shared(self, key: SharedKey, shared: _Shared, bodies: list[bytes],
                           waiters: list[asyncio.Future[Placed]]) -> None:
        url, topic, ack, authorization = key
        try:
            placed = await self._post(url, topic, _HEAD + b",".join(bodies) + _TAIL, ack, authorization)
            if len(placed) != len(waiters):
                raise Refused(502, "bad_owner_answer", f"the owner {url} placed {len(placed)} of {len(waiters)} "
                                                       "messages")
        except asyncio.CancelledError:  # this node stops: the producers retry
            _fail(waiters, _stopping())
            raise
        except Exception as exc:  # noqa: BLE001 - the refusal (or a bug) is each message's answer: none may hang
            _fail(waiters, exc)
        else:
            for waiter, one in zip(waiters, placed, strict=True):
                if not waiter.done():  # its producer may have gone meanwhile
                    waiter.set_result(one)
        finally:
            shared.in_flight -= 1
            if shared.bodies and self._closing:
                _fail(shared.waiters, _stopping())
                shared.bodies, shared.waiters, shared.size = [], [], 0
            elif shared.bodies:
                self._send(key, shared)
            elif shared.in_flight == 0 and self._shared.get(key) is shared:
                del self._shared[key]

    def _silent(self, url: str) -> NoOwnerYet:
        return NoOwnerYet(f"the owner of these partitions, {url}, did not answer within {self.timeout_s:g} s (the "
                          "lease TTL; an owner that stays silent loses them to a live node); retry in a second", 1.0)

    async def batch(self, url: str, topic: str, messages: list[NewMessage], partitions: list[int], ack: AckMode,
                    authorization: str | None) -> list[Placed]:
        """Produce `messages` at `partitions` through the owner at `url`; each one's placement."""
        body = orjson.dumps({"messages": [message_json(m, p) for m, p in zip(messages, partitions, strict=True)]})
        return await self._post(url, topic, body, ack, authorization)

    async def _post(self, url: str, topic: str, body: bytes, ack: AckMode, authorization: str | None) -> list[Placed]:
        headers = {"content-type": "application/json", FORWARDED_BY: self.node}
        if authorization:
            headers["authorization"] = authorization
        try:
            async with asyncio.timeout(self.timeout_s):
                r = await self._client(url).post(f"{url}/v1/topics/{topic}/batch", params={"ack": ack.value},
                                                 content=body, headers=headers)
        except (TimeoutError, httpx.TimeoutException):
            # Its messages may be stored all the same: a retry with ids is answered from the dedup index.
            raise self._silent(url) from None
        except httpx.HTTPError as exc:  # refused or reset: the owner died, and its lease has not yet run out
            raise NoOwnerYet(f"the owner of these partitions, {url}, did not answer ({type(exc).__name__}: {exc}); "
                             "its partitions move to a live node within the lease TTL: retry in a second",
                             1.0) from None
        answer = _json(r)
        if r.status_code not in (200, 202):
            error = answer.get("error") if isinstance(answer, dict) else None
            if r.status_code == 421 or (r.status_code == 503 and isinstance(error, dict)
                                        and error.get("code") == NoOwnerYet.code):
                # The partition moved on since this node's last heartbeat: the producer retries (a
                # 421 would tell it that it, not this node, sent the message to the wrong place).
                raise NoOwnerYet(f"the partitions of these messages are changing owners ({url}: "
                                 f"{error.get('message') if isinstance(error, dict) else r.status_code}); "
                                 "retry in a second", 1.0)
            if isinstance(error, dict):
                raise Refused(r.status_code, str(error.get("code")), str(error.get("message")))
            raise Refused(502, "bad_owner_answer", f"the owner {url} answered {r.status_code}: {r.text[:300]}")
        try:
            return [(int(x["partition"]), x["offset"], bool(x["duplicate"]), _micros(x.get("timestamp")))
                    for x in answer["results"]]
        except (KeyError, TypeError, ValueError):
            raise Refused(502, "bad_owner_answer", f"the owner {url} answered a batch without results") from None


def _stopping() -> NoOwnerYet:
    return NoOwnerYet("this node is stopping; retry in a second", 1.0)


def _fail(waiters: list[asyncio.Future[Placed]], exc: BaseException) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_exception(exc)


def _json(r: httpx.Response) -> Any:
    try:
        return orjson.loads(r.content)
    except orjson.JSONDecodeError:
        return None


def _micros(timestamp: str | None) -> int | None:
    if timestamp is None:
        return None
    return (datetime.fromisoformat(timestamp) - _EPOCH) // timedelta(microseconds=1)
