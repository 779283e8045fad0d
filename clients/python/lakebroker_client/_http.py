"""The one HTTP layer of the client: base URL, token, retries (tenacity), and error answers mapped in one place.

Tests swap the transport (`httpx.MockTransport`, or a wrapper that loses answers) through the
`transport` argument every client class takes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NoReturn

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, retry_if_result, stop_after_delay

from lakebroker_client._exceptions import BrokerUnavailable, ClientClosed, RequestRefused
from lakebroker_client._retry import RETRIABLE_STATUSES, Retry

USER_AGENT = "lakebroker-python/0.1.0"


def error_message(response: httpx.Response) -> tuple[str, str]:
    """(code, message) of an error answer: the API's `{"error": {...}}`, else the text."""
    try:
        error = response.json()["error"]
        return str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return "http_error", response.text[:500] or response.reason_phrase


def refused(response: httpx.Response, what: str) -> RequestRefused:
    code, message = error_message(response)
    return RequestRefused(f"{what}: HTTP {response.status_code} {code}: {message}", response.status_code, code)


def _retriable(response: httpx.Response) -> bool:
    return response.status_code in RETRIABLE_STATUSES


def _last(state: RetryCallState) -> tuple[str, int | None]:
    """What went wrong in the latest attempt, and its HTTP status (None: no answer)."""
    assert state.outcome is not None
    if state.outcome.failed:
        exc = state.outcome.exception()
        return f"no answer ({type(exc).__name__}: {exc})", None
    response: httpx.Response = state.outcome.result()
    return f"HTTP {response.status_code} {': '.join(error_message(response))}", response.status_code


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
        what = f"{method} {path}"
        latest = ""  # the last problem; tenacity clears the outcome before it sleeps

        def attempt() -> httpx.Response:
            if self.closing.is_set():
                raise ClientClosed(f"closed before {what} was answered")
            return self.client.request(method, path, **kwargs)

        def before_sleep(state: RetryCallState) -> None:
            nonlocal latest
            latest, status = _last(state)
            if on_retry is not None:
                on_retry(status)

        def sleep(seconds: float) -> None:
            if self.closing.wait(seconds):
                raise ClientClosed(f"closed while retrying {what} (last: {latest})")

        def give_up(state: RetryCallState) -> NoReturn:
            problem, status = _last(state)
            raise BrokerUnavailable(f"{what}: gave up after {state.attempt_number} attempts in "
                                    f"{self.retry.timeout_s:g} s; last: {problem}", status)

        retrying = Retrying(
            retry=retry_if_exception_type(httpx.TransportError) | retry_if_result(_retriable),
            stop=stop_after_delay(self.retry.timeout_s),
            wait=self.retry.wait(),
            sleep=sleep,
            before_sleep=before_sleep,
            retry_error_callback=give_up,
        )
        response: httpx.Response = retrying(attempt)
        return response

    def close(self) -> None:
        self.closing.set()
        self.client.close()
