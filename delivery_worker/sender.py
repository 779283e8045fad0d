"""POSTs signed messages to an endpoint and classifies the answer."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from lakebroker.delivery_worker.flow import ByteBudget
from lakebroker.delivery_worker.http1 import LeanTransport, origin_of
from lakebroker.delivery_worker.retry import parse_retry_after
from lakebroker.delivery_worker.signer import Signer
from lakebroker.tables.message_format import message_json
from lakebroker.tables.subscriptions import redact_url

log = logging.getLogger(__name__)
SPLIT_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class Outcome:
    status: int | None  # None: no answer (timeout, refused connection)
    error: str | None = None
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def gone(self) -> bool:
        """410 Gone: the endpoint asks never to be called again (Standard Webhooks)."""
        return self.status == 410


def message_id(topic: str, partition: int, offset: int) -> str:
    """Stable across retries, so a receiver can drop a redelivery it already processed."""
    return f"msg_{topic}_{partition}_{offset}"


def envelope(topic: str, row: dict[str, Any]) -> dict[str, Any]:
    return {"topic": topic, **message_json(row)}


class _Target:
    """What every request to one URL for one topic shares: where it goes and the fixed head lines."""

    def __init__(self, url: str, topic: str, worker_id: str) -> None:
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {parsed.scheme!r}")
        self.origin = origin_of(parsed)
        self.head = (b"POST " + parsed.raw_path + b" HTTP/1.1\r\nhost: " + parsed.netloc
                     + b"\r\ncontent-type: application/json\r\nlakebroker-topic: " + topic.encode()
                     + b"\r\nlakebroker-worker: " + worker_id.encode() + b"\r\n")


class Sender:
    """Writes each request's bytes straight to the lean transport (http1.py): httpx's client layer,
    and even its Request and Response objects (header normalisation), cost CPU per request that a
    webhook POST needs none of (docs/decisions/0017-webhooks-sent-through-a-lean-http1-transport.md).
    Every header value is a validated name, a number, a signature or a key checked to be printable
    ASCII, so none can break a line."""

    def __init__(self, transport: LeanTransport, worker_id: str, budget: ByteBudget | None = None) -> None:
        """`budget`: the process's read-ahead bound, which each body in flight counts against too."""
        self.transport = transport
        self.worker_id = worker_id
        self.budget = budget or ByteBudget(0)
        self._targets: dict[tuple[str, str], _Target] = {}

    async def send(self, url: str, topic: str, rows: list[dict[str, Any]], signer: Signer, timeout_s: float,
                   batch: bool, id_suffix: str = "") -> Outcome:
        """`id_suffix`: a replay's, so a receiver that drops webhook-ids it has seen takes the replay."""
        first = rows[0]
        if batch:
            body = orjson.dumps([envelope(topic, r) for r in rows])
            msg_id = message_id(topic, first["partition"], first["offset"]) + f"-{rows[-1]['offset']}{id_suffix}"
        else:
            body = orjson.dumps(envelope(topic, first))
            msg_id = message_id(topic, first["partition"], first["offset"]) + id_suffix
        if len(body) >= SPLIT_BODY_BYTES:
            # orjson's output buffer is several times the JSON it holds (8 MB for a 1 MB value), and
            # it would stay allocated for as long as the request is in flight: kept at its size.
            body = memoryview(body).tobytes()
        try:
            target = self._targets.get((url, topic))
            if target is None:
                target = self._targets[(url, topic)] = _Target(url, topic, self.worker_id)
            lines = [f"content-length: {len(body)}", f"lakebroker-partition: {first['partition']}",
                     f"lakebroker-offset: {first['offset']}",
                     *(f"{name}: {value}" for name, value in signer.headers(msg_id, body.decode()).items())]
            key = first["key"]
            if not batch and key is not None and key.isascii() and key.isprintable() and len(key) < 1024:
                lines.append(f"lakebroker-key: {key}")
            head = target.head + "\r\n".join(lines).encode() + b"\r\n\r\n"
            # A large body goes out beside its head, not copied onto its end.
            payload: bytes | tuple[bytes, bytes] = head + body if len(body) < SPLIT_BODY_BYTES else (head, body)
            timeouts: dict[str, float | None] = {"connect": timeout_s, "read": timeout_s, "pool": timeout_s}
            self.budget.used += len(body)  # a copy of what the read-ahead holds, while it is sent
            try:
                status, headers, answer = await self.transport.exchange(target.origin, payload, timeouts)
            finally:
                self.budget.used -= len(body)
            if 200 <= status < 300:
                return Outcome(status)
            text = answer[:300].decode(errors="replace")
        except httpx.TimeoutException:
            return Outcome(None, f"timed out after {timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Outcome(None, f"{type(exc).__name__}: {exc}"[:500])
        except Exception as exc:  # a bug here must cost a retry, never a stalled partition
            log.exception("sending to %s failed unexpectedly", redact_url(url))  # a URL may hold a secret
            return Outcome(None, f"internal error: {type(exc).__name__}: {exc}"[:500])
        retry_after = None
        if status in (429, 503):
            value = next((v for k, v in headers if k.lower() == b"retry-after"), None)
            retry_after = parse_retry_after(None if value is None else value.decode("latin-1"))
        return Outcome(status, f"HTTP {status}: {text}", retry_after)
