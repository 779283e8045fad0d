"""The one HTTP layer of the client: base URL, token, retries, and error answers mapped in one place.

Tests swap the transport (`httpx.MockTransport`, or a wrapper that loses answers) through the
`transport` argument every client class takes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from delivery_worker.retry import parse_retry_after
from lakebroker.client._exceptions import BrokerUnavailable, ClientClosed, RequestRefused
from lakebroker.client._retry import RETRIABLE_STATUSES, Retry

USER_AGENT = "lakebroker-python/0.1.0"


def error_message(response: httpx.Response) -> tuple[str, str]:
    """(code, message) of an error answer: the API's `{"error": {...}}`, else the text."""
    try:
        body = response.json()
        error = body["error"]
        return str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return "http_error", response.text[:500] or response.reason_phrase


def refused(response: httpx.Response, what: str) -> RequestRefused:
    code, message = error_message(response)
    return RequestRefused(f"{what}: HTTP {response.status_code} {code}: {message}", response.status_code, code)


class Http:
    def __init__(self, url: str, token: str | None, *, timeout_s: float, retry: Retry,
                 transport: httpx.BaseTransport | None) -> None:
        headers = {"user-agent": USER_AGENT}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self.client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport)
        self.retry = retry
        self.closing = threading.Event()  # set by close(): backoff sleeps end at once

    def request(self, method: str, path: str, *, on_retry: Callable[[int | None], None] | None = None,
                **kwargs: Any) -> httpx.Response:
        """Send until an answer that retrying cannot change (a 2xx or a refusal), which is returned.

        Raises BrokerUnavailable when `retry.timeout_s` runs out, ClientClosed when close() interrupts.
        """
        deadline = time.monotonic() + self.retry.timeout_s
        failures = 0
        while True:
            if self.closing.is_set():
                raise ClientClosed(f"closed before {method} {path} was answered")
            retry_after = None
            status: int | None = None
            try:
                response = self.client.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                problem = f"no answer ({type(exc).__name__}: {exc})"
            else:
                if response.status_code not in RETRIABLE_STATUSES:
                    return response
                status = response.status_code
                problem = f"HTTP {status} {': '.join(error_message(response))}"
                if status in (429, 503):
                    retry_after = parse_retry_after(response.headers.get("retry-after"))
            failures += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerUnavailable(f"{method} {path}: gave up after {failures} attempts in "
                                        f"{self.retry.timeout_s:g} s; last: {problem}", status)
            if on_retry is not None:
                on_retry(status)
            if self.closing.wait(min(self.retry.backoff_s(failures, retry_after), remaining)):
                raise ClientClosed(f"closed while retrying {method} {path} (last: {problem})")

    def close(self) -> None:
        self.closing.set()
        self.client.close()
