"""A demo webhook receiver: verifies lakebroker deliveries with `lakebroker_client.fastapi.WebhookDependency`.

    WEBHOOK_SECRETS=whsec_... uvicorn --factory examples.receiver:create_app_from_env --port 8000

WEBHOOK_SECRETS holds one secret, or two separated by a comma while a secret is being rotated.
Point a subscription at `http://<host>:8000/hook`; `GET /received` shows the latest messages.
A bad signature is answered 401, so the broker retries and, in the end, dead-letters it.
"""

# No `from __future__ import annotations` here: FastAPI must see the Annotated dependency, which
# names a local (`verified`), as an object rather than a string.

import base64
import logging
import os
from collections import OrderedDict, deque
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Response

from lakebroker_client import Delivery, Message
from lakebroker_client.fastapi import WebhookDependency

log = logging.getLogger("receiver")
REMEMBERED_IDS = 100_000


def create_app(secrets: str | list[str]) -> FastAPI:
    verified = WebhookDependency(secrets)
    app = FastAPI(title="lakebroker demo receiver")
    seen: OrderedDict[str, None] = OrderedDict()
    app.state.deliveries = deliveries = deque[Delivery](maxlen=10_000)

    @app.post("/hook", status_code=204)
    async def hook(delivery: Annotated[Delivery, Depends(verified)]) -> Response:
        if delivery.id in seen:  # a redelivery of one already processed (its answer was lost)
            return Response(status_code=204)
        for message in delivery.messages:
            log.info("%s[%d]@%d key=%s value=%r", message.topic, message.partition, message.offset, message.key,
                     message.value)
        deliveries.append(delivery)
        seen[delivery.id] = None
        while len(seen) > REMEMBERED_IDS:
            seen.popitem(last=False)
        return Response(status_code=204)

    @app.get("/received")
    async def received(limit: int = 100) -> list[dict[str, Any]]:
        """The latest messages received, newest last (binary values base64-encoded in value_b64)."""
        messages = [m for d in deliveries for m in d.messages]
        return [_public(m) for m in messages[-limit:]]

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _public(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"topic": m.topic, "partition": m.partition, "offset": m.offset,
                           "timestamp": m.timestamp.isoformat(), "key": m.key, "format": m.format, "headers": m.headers}
    if isinstance(m.value, bytes):
        out["value_b64"] = base64.b64encode(m.value).decode()
    else:
        out["value"] = m.value
    return out


def create_app_from_env() -> FastAPI:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    secrets = [s.strip() for s in os.environ.get("WEBHOOK_SECRETS", "").split(",") if s.strip()]
    if not secrets:
        raise SystemExit("set WEBHOOK_SECRETS to the subscription's whsec_... secret")
    return create_app(secrets)
