"""`WebhookVerifier`: checks Standard Webhooks signatures of lakebroker deliveries and parses them.

Framework-free: `verify(body, headers)` works in any server (`lakebroker_client.fastapi` wraps
it as a FastAPI dependency). Signatures are checked by the `standardwebhooks` library:
HMAC-SHA256 over `id.timestamp.body`, timestamps within 5 minutes of now.

Secret rotation: the broker signs with every current secret of a subscription (the new and the
previous one, until `end_rotation`), and a verifier accepts a delivery that any one of its
secrets verifies. So either side may move first.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from standardwebhooks import Webhook
from standardwebhooks.webhooks import EmptyWebhookSecretError, WebhookVerificationError

from lakebroker_client._exceptions import InvalidDelivery, SignatureInvalid
from lakebroker_client._models import Delivery, Message


class WebhookVerifier:
    """Verifies deliveries signed with one of `secrets` (`whsec_...`, as the subscription returned it).

        verifier = WebhookVerifier(os.environ["WEBHOOK_SECRET"])
        delivery = verifier.verify(request_body, request_headers)  # SignatureInvalid: answer 401
        for message in delivery.messages: ...
    """

    def __init__(self, secrets: str | Sequence[str]) -> None:
        listed = [secrets] if isinstance(secrets, str) else list(secrets)
        if not listed:
            raise ValueError("give at least one webhook secret")
        try:
            self._hooks = [Webhook(s) for s in listed]
        except (binascii.Error, ValueError, EmptyWebhookSecretError) as exc:
            raise ValueError(f"not a webhook secret (whsec_ + base64): {exc}") from None

    def verify(self, body: bytes | str, headers: Mapping[str, str]) -> Delivery:
        """The delivery, if a secret verifies its signature; else SignatureInvalid (or InvalidDelivery)."""
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        plain = {k.lower(): v for k, v in headers.items()}
        problem = "no webhook-signature matched"
        for hook in self._hooks:
            try:
                hook.verify(text, plain, json_parse=False)
                break
            except WebhookVerificationError as exc:
                problem = str(exc)
            except (ValueError, TypeError):  # a malformed signature header (no "v1,", bad base64)
                problem = "malformed webhook-signature header"
        else:
            raise SignatureInvalid(f"webhook signature rejected: {problem}")
        return self._parse(text, plain)

    @staticmethod
    def _parse(text: str, headers: Mapping[str, str]) -> Delivery:
        try:
            data = json.loads(text)
            batch = isinstance(data, list)
            messages = [Message.from_json(m) for m in (data if batch else [data])]
            timestamp = datetime.fromtimestamp(int(float(headers["webhook-timestamp"])), UTC)
        except (ValueError, TypeError, KeyError, binascii.Error) as exc:
            raise InvalidDelivery(f"signed body is not a lakebroker delivery: {exc}"[:500]) from None
        if not messages:
            raise InvalidDelivery("signed body is an empty batch")
        return Delivery(id=headers["webhook-id"], timestamp=timestamp, messages=messages, batch=batch)
