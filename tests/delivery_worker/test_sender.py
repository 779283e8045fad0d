"""What the sender logs of a webhook URL: its origin, never its path, query or credentials."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from lakebroker.delivery_worker.sender import Sender
from lakebroker.delivery_worker.signer import Signer
from lakebroker.tables.subscriptions import new_secret, redact_url


class _Broken:
    async def exchange(self, origin: Any, payload: bytes, timeouts: Any) -> Any:
        raise RuntimeError("a bug in the transport")


async def test_an_unexpected_send_failure_logs_the_url_without_its_secret(caplog: pytest.LogCaptureFixture) -> None:
    url = "https://hooks.example.com/services/T0/B0/s3cr3t?key=abc"
    row = {"partition": 0, "offset": 7, "timestamp": datetime.now(UTC), "key": None, "value": b"v", "format": "text",
           "headers": None,
           "message_id": None, "producer_id": None, "sequence": None}
    with caplog.at_level(logging.ERROR):
        outcome = await Sender(_Broken(), "w1").send(url, "t", [row], Signer((new_secret(),)), 5.0, False)  # type: ignore[arg-type]
    assert outcome.status is None and "RuntimeError" in (outcome.error or "")
    assert "sending to https://hooks.example.com/… failed unexpectedly" in caplog.text
    assert "s3cr3t" not in caplog.text and "abc" not in caplog.text


@pytest.mark.parametrize(("url", "shown"), [
    ("https://hooks.example.com/services/T0/B0/s3cr3t?key=abc#f", "https://hooks.example.com/…"),
    ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/"),
    ("http://[::1]:9/x", "http://[::1]:9/…"),
    ("https://example.com?token=t", "https://example.com/…"),
    ("http://[::1/", "<malformed url>"),
])
def test_redact_url_keeps_the_origin_alone(url: str, shown: str) -> None:
    assert redact_url(url) == shown
