"""A demo webhook receiver: verifies lakebroker deliveries with `lakebroker.client.WebhookVerifier`.

    WEBHOOK_SECRETS=whsec_... uvicorn --factory examples.receiver:create_app_from_env --port 8000

WEBHOOK_SECRETS holds one secret, or two separated by a comma while a secret is being rotated.
Point a subscription at `http://<host>:8000/hook`; `GET /received` shows the latest messages.
A bad signature is answered 401, so the broker retries and, in the end, dead-letters it.
"""

# No `from __future__ import annotations` here: FastAPI must see the Annotated dependency, which
# names a local (`verified`), as an object rather than a string.

import logging
import os
from collections import OrderedDict, deque
from typing import Annotated

from fastapi import Depends, FastAPI, Response

from lakebroker.client import Delivery, Message, WebhookVerifier

log = logging.getLogger("receiver")
REMEMBERED_IDS = 100_000


def create_app(secrets: str | list[str]) -> FastAPI:
    verified = WebhookVerifier(secrets)
    app = FastAPI(title="lakebroker demo receiver")
    seen: OrderedDict[str, None] = OrderedDict()
    app.state.deliveries = deliveries = deque[Delivery](maxlen=10_000)

    @app.post("/hook", status_code=204)
    async def hook(delivery: Annotated[Delivery, Depends(verified)]) -> Response:
        if delivery.id in seen:  # a redelivery of one already processed (its answer was lost)
            return Response(status_code=204)
        for message in delivery.messages:
            log.info("%s[%d]@%d key=%s value=%r", message.topic, message.partition, message.offset, message.key,
                     message.value if message.value_b64 is None else message.data)
        deliveries.append(delivery)
        seen[delivery.id] = None
        while len(seen) > REMEMBERED_IDS:
            seen.popitem(last=False)
        return Response(status_code=204)

    @app.get("/received")
    async def received(limit: int = 100) -> list[Message]:
        """The latest messages received, newest last."""
        messages = [m for d in deliveries for m in d.messages]
        return messages[-limit:]

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def create_app_from_env() -> FastAPI:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    secrets = [s.strip() for s in os.environ.get("WEBHOOK_SECRETS", "").split(",") if s.strip()]
    if not secrets:
        raise SystemExit("set WEBHOOK_SECRETS to the subscription's whsec_... secret")
    return create_app(secrets)
