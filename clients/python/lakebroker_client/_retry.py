"""`Retry`: when the client tries again, and when it gives up. The loop itself is tenacity's (`_http.py`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
from tenacity import RetryCallState
from tenacity.wait import wait_base, wait_exponential

# Answers that mean "not now": back-pressure, a restarting or overloaded broker, a full disk.
RETRIABLE_STATUSES = frozenset({429, 500, 502, 503, 504, 507})
MAX_RETRY_AFTER_S = 3600.0


@dataclass(frozen=True)
class Retry:
    """Exponential backoff with jitter, bounded by a total time per request.

    Connection errors, timeouts, 429 and 5xx answers are retried until `timeout_s` has passed
    since the first attempt. A 429 or 503 with `Retry-After` waits at least that long (but
    never past the deadline). `Retry(timeout_s=0)` tries once.
    """

    timeout_s: float = 120.0
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    jitter: float = 0.2  # ±20 %, so many clients do not retry in lockstep

    def __post_init__(self) -> None:
        if self.timeout_s < 0:
            raise ValueError(f"Retry.timeout_s must be >= 0, not {self.timeout_s}")
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(f"Retry needs 0 < initial_backoff_s <= max_backoff_s, not {self.initial_backoff_s} "
                             f"and {self.max_backoff_s}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"Retry.jitter must be in [0, 1), not {self.jitter}")

    def wait(self) -> wait_base:
        """The tenacity wait strategy of this policy."""
        return _Backoff(self)


class _Backoff(wait_base):
    """initial_backoff_s doubling per failure up to max_backoff_s, ± jitter; Retry-After wins when
    longer; never past the deadline."""

    def __init__(self, retry: Retry) -> None:
        self.retry = retry
        self.exponential = wait_exponential(multiplier=retry.initial_backoff_s, max=retry.max_backoff_s)

    def __call__(self, retry_state: RetryCallState) -> float:
        jitter = self.retry.jitter
        delay = self.exponential(retry_state) * (1 + random.uniform(-jitter, jitter))
        outcome = retry_state.outcome
        if outcome is not None and not outcome.failed:
            response: httpx.Response = outcome.result()
            if response.status_code in (429, 503):
                after = retry_after_s(response.headers.get("retry-after"))
                delay = delay if after is None else max(delay, after)
        remaining = self.retry.timeout_s - (retry_state.seconds_since_start or 0.0)
        return max(0.0, min(delay, remaining))


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), capped at an hour; None if
    absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # ASCII only: "²".isdigit() is true
        significant = value.lstrip("0")  # a huge number of digits is capped, never parsed
        return MAX_RETRY_AFTER_S if len(significant) > 8 else min(float(significant or 0), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max((when - datetime.now(UTC)).total_seconds(), 0.0), MAX_RETRY_AFTER_S)
