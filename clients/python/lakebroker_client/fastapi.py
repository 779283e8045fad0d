"""`WebhookDependency`: `WebhookVerifier` as a FastAPI dependency. Needs `lakebroker-client[fastapi]`;
the rest of the client never imports this module.

    verified = WebhookDependency(os.environ["WEBHOOK_SECRET"])

    @app.post("/hook", status_code=204)
    async def hook(delivery: Annotated[Delivery, Depends(verified)]) -> None:
        for message in delivery.messages: ...
"""

from __future__ import annotations

from fastapi import HTTPException, Request

from lakebroker_client._exceptions import InvalidDelivery, SignatureInvalid
from lakebroker_client._models import Delivery
from lakebroker_client._webhooks import WebhookVerifier

__all__ = ["WebhookDependency"]


class WebhookDependency(WebhookVerifier):
    async def __call__(self, request: Request) -> Delivery:
        """401 for a bad signature, 400 for a signed body that is no envelope; else the delivery."""
        body = await request.body()
        try:
            return self.verify(body, request.headers)
        except SignatureInvalid as exc:
            raise HTTPException(status_code=401, detail=exc.message) from None
        except InvalidDelivery as exc:
            raise HTTPException(status_code=400, detail=exc.message) from None
