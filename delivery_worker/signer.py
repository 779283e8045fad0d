"""Standard Webhooks signing: `webhook-id`, `webhook-timestamp`, `webhook-signature` (v1)."""

from __future__ import annotations

from datetime import UTC, datetime

from standardwebhooks import Webhook


class Signer:
    def __init__(self, secrets: tuple[str, ...]) -> None:
        # Every current secret signs, so a receiver rotating its secret verifies with either.
        self._hooks = [Webhook(s) for s in secrets]

    def headers(self, msg_id: str, body: str, now: datetime | None = None) -> dict[str, str]:
        moment = now or datetime.now(UTC)
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(moment.timestamp())),
            "webhook-signature": " ".join(h.sign(msg_id, moment, body) for h in self._hooks),
        }
