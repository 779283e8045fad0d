"""Operational webhooks: the delivery workers tell the broker's operators, at one URL, when a
subscription is disabled and when its endpoint recovers (as Svix sends `endpoint.disabled`), signed
to the Standard Webhooks spec like every delivery (settings `operational_webhook_url`, `_secret`).

Each event is POSTed by the worker that made the change, with a few retries; one that still fails
is logged, never in the way of delivery. Its `webhook-id` names the subscription and the failure
it ends, so two workers telling the same recovery send the same id, and a receiver keeps one.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from lakebroker.delivery_worker.signer import Signer
from lakebroker.tables.settings import Settings
from lakebroker.tables.subscriptions import Subscription
from lakebroker.tables.webhook_urls import check_webhook_url

log = logging.getLogger(__name__)
DISABLED, RECOVERED = "subscription.disabled", "subscription.recovered"
RETRY_S = (1.0, 5.0, 30.0)  # before the 2nd, 3rd and 4th attempt


class OperationalWebhooks:
    def __init__(self, url: str, secret: str, *, allow_private: bool) -> None:
        self.url = check_webhook_url(url, allow_private=allow_private)
        self._signer = Signer((secret,))
        self._client: httpx.AsyncClient | None = None  # made on the first event, in the worker's loop
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def of(cls, settings: Settings) -> OperationalWebhooks | None:
        if settings.operational_webhook_url is None or settings.operational_webhook_secret is None:
            return None
        return cls(settings.operational_webhook_url, settings.operational_webhook_secret.get_secret_value(),
                   allow_private=settings.allow_private_webhooks)

    def disabled(self, sub: Subscription, reason: str, since: datetime | None) -> None:
        self._send(DISABLED, sub, since, {"reason": reason,
                                          "failing_since": None if since is None else since.isoformat()})

    def recovered(self, sub: Subscription, since: datetime) -> None:
        self._send(RECOVERED, sub, since, {"failing_since": since.isoformat()})

    async def aclose(self) -> None:
        """Let the events under way finish (each is bounded by its retries), then close."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
            for task in self._tasks:
                task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _send(self, kind: str, sub: Subscription, since: datetime | None, data: dict[str, Any]) -> None:
        now = datetime.now(UTC)
        moment = since or now
        msg_id = f"op_{kind.split('.')[1]}_{sub.name}_{int(moment.timestamp() * 1000)}"
        body = orjson.dumps({"type": kind, "timestamp": now.isoformat(),
                             "data": {"subscription": sub.name, "topic": sub.topic, **data}}).decode()
        task = asyncio.create_task(self._post(msg_id, body, kind, sub.name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, msg_id: str, body: str, kind: str, name: str) -> None:
        error = ""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=10)
        for pause in (0.0, *RETRY_S):
            await asyncio.sleep(pause)
            headers = {"content-type": "application/json", **self._signer.headers(msg_id, body)}
            try:
                answer = await self._client.post(self.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
                continue
            if answer.is_success:
                return
            error = f"HTTP {answer.status_code}"
            if 400 <= answer.status_code < 500 and answer.status_code not in (408, 429):
                break  # refused: another try gets the same answer
        log.warning("operational webhook %s for subscription %s not delivered to %s: %s", kind, name, self.url, error)
