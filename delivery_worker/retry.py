"""The retry policy: the one owner of "when is the next attempt, and when do we give up"."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

MAX_RETRY_AFTER_S = 3600.0


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), capped at an hour.

    The value comes from the endpoint, so anything else (Unicode digits, signs, exponents, absurd
    dates) is None: ignored, never an exception in the delivery."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # RFC 9110: 1*DIGIT, ASCII only ("²".isdigit() is true)
        significant = value.lstrip("0")
        return MAX_RETRY_AFTER_S if len(significant) > 8 else min(float(significant or 0), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


@dataclass(frozen=True)
class RetryPolicy:
    schedule_ms: tuple[int, ...]
    max_attempts: int
    jitter: float = 0.2  # ±20 %, as Svix does, so failed endpoints are not hit in lockstep

    def exhausted(self, attempts: int) -> bool:
        return attempts >= self.max_attempts

    def delay_s(self, attempts: int, retry_after_s: float | None = None, rng: random.Random | None = None) -> float:
        """Wait before attempt `attempts + 1`. The schedule's last delay repeats; Retry-After wins if longer."""
        base = self.schedule_ms[min(attempts - 1, len(self.schedule_ms) - 1)] / 1000
        factor = 1 + (rng or random).uniform(-self.jitter, self.jitter)
        delay = base * factor
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        return delay
