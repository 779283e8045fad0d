"""POSTs signed messages to an endpoint and classifies the answer."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from delivery_worker.retry import parse_retry_after
from delivery_worker.signer import Signer
from tables.message_format import message_json

log = logging.getLogger(__name__)


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


class Sender:
    """Builds httpx requests and hands them straight to the transport: httpx's client layer
    (auth, cookies, redirects, hooks) costs ~170 us a request and a webhook needs none of it."""

    def __init__(self, transport: httpx.AsyncBaseTransport, worker_id: str) -> None:
        self.transport = transport
        self.worker_id = worker_id
        self._urls: dict[str, tuple[httpx.URL, str]] = {}  # url -> (parsed, Host header)

    async def send(self, url: str, topic: str, rows: list[dict[str, Any]], signer: Signer, timeout_s: float,
                   batch: bool) -> Outcome:
        first = rows[0]
        if batch:
            body = orjson.dumps([envelope(topic, r) for r in rows]).decode()
            msg_id = message_id(topic, first["partition"], first["offset"]) + f"-{rows[-1]['offset']}"
        else:
            body = orjson.dumps(envelope(topic, first)).decode()
            msg_id = message_id(topic, first["partition"], first["offset"])
        target = self._urls.get(url)
        if target is None:
            parsed = httpx.URL(url)
            target = self._urls[url] = (parsed, parsed.netloc.decode("ascii"))
        data = body.encode()
        headers = {
            "host": target[1],
            "content-type": "application/json",
            "content-length": str(len(data)),
            "lakebroker-topic": topic,
            "lakebroker-partition": str(first["partition"]),
            "lakebroker-offset": str(first["offset"]),
            "lakebroker-worker": self.worker_id,
            **signer.headers(msg_id, body),
        }
        key = first["key"]
        if not batch and key is not None and key.isascii() and key.isprintable() and len(key) < 1024:
            headers["lakebroker-key"] = key
        timeouts = {"connect": timeout_s, "read": timeout_s, "write": timeout_s, "pool": timeout_s}
        # stream=, with Host and Content-Length set here: httpx then skips re-deriving them.
        request = httpx.Request("POST", target[0], headers=headers, stream=httpx.ByteStream(data),
                                extensions={"timeout": timeouts})
        try:
            response = await self.transport.handle_async_request(request)
            if 200 <= response.status_code < 300:
                return Outcome(response.status_code)
            text = (await response.aread())[:300].decode(errors="replace")
        except httpx.TimeoutException:
            return Outcome(None, f"timed out after {timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Outcome(None, f"{type(exc).__name__}: {exc}"[:500])
        except Exception as exc:  # a bug here must cost a retry, never a stalled partition
            log.exception("sending to %s failed unexpectedly", url)
            return Outcome(None, f"internal error: {type(exc).__name__}: {exc}"[:500])
        retry_after = None
        if response.status_code in (429, 503):
            retry_after = parse_retry_after(response.headers.get("retry-after"))
        return Outcome(response.status_code, f"HTTP {response.status_code}: {text}", retry_after)
