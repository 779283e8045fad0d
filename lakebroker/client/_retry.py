"""`Retry`: when the client tries again, and when it gives up."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Answers that mean "not now": back-pressure, a restarting or overloaded broker, a full disk.
RETRIABLE_STATUSES = frozenset({429, 500, 502, 503, 504, 507})


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

    def backoff_s(self, failures: int, retry_after_s: float | None = None) -> float:
        """Wait after the `failures`-th failed attempt (1-based); Retry-After wins when longer."""
        base = min(self.max_backoff_s, self.initial_backoff_s * 2.0 ** max(0, failures - 1))
        delay = base * (1 + random.uniform(-self.jitter, self.jitter))
        return delay if retry_after_s is None else max(delay, retry_after_s)
