"""An endpoint's circuit breaker: an endpoint that keeps failing gets a rest, not every retry at once.

- closed: sends go. `failures` endpoint failures in a row (no answer, a timeout, a 5xx, 408 or 429)
  open it; any answer that shows the endpoint up (a 2xx, or another 4xx) ends the run. With a
  `ratio`, so does a share of failures at or above it among the attempts of the last `window_s`,
  once there were `min_requests` of them (Convoy's breaker): an endpoint that fails every other
  request never has a long run, but is failing all the same.
- open: no send starts, and a send that fails as it opens spends no attempt, so messages are not
  retried away and dead-lettered while the endpoint is down. After `cooldown_s` it is half-open.
- half-open: one send goes, the probe. An answer closes it; a failure opens it again for twice the
  last cool-down, up to MAX_COOLDOWN_S.

One breaker per subscription and worker process: the partitions a worker delivers of a subscription
share it, as they share the endpoint's window and rate limit (sending.py's Endpoint).
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable

MAX_COOLDOWN_S = 600.0


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Turn(enum.Enum):
    SEND = "send"
    PROBE = "probe"


def endpoint_failure(status: int | None) -> bool:
    """Whether an attempt's outcome says the endpoint is down or overloaded, not that it refused
    one message (a 4xx other than 408 and 429 is an answer: the endpoint is up)."""
    return status is None or status >= 500 or status in (408, 429)


class FailureWindow:
    """Attempts and endpoint failures over the last `window_s`, in one-second buckets: a count per
    second, not an entry per attempt, at any rate."""

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self.window_s = window_s
        self._clock = clock
        self._buckets: deque[list[int]] = deque()  # [second, attempts, failures], oldest first

    def add(self, failed: bool) -> None:
        second = int(self._clock())
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append([second, 0, 0])
        bucket = self._buckets[-1]
        bucket[1] += 1
        bucket[2] += failed

    def counts(self) -> tuple[int, int]:
        """(attempts, failures) within the window."""
        oldest = self._clock() - self.window_s
        while self._buckets and self._buckets[0][0] < oldest:
            self._buckets.popleft()
        return sum(b[1] for b in self._buckets), sum(b[2] for b in self._buckets)

    def clear(self) -> None:
        self._buckets.clear()


class CircuitBreaker:
    def __init__(self, failures: int, cooldown_s: float, *, ratio: float | None = None, window_s: float = 60.0,
                 min_requests: int = 20, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[State], None] = lambda state: None) -> None:
        """`failures`: 0 never opens on a run. `ratio`: None never opens on a share."""
        self.failures = failures
        self.base_cooldown_s = cooldown_s
        self.ratio = ratio
        self.min_requests = min_requests
        self.window = FailureWindow(window_s, clock)
        self.state = State.CLOSED
        self.run = 0  # endpoint failures in a row
        self.retry_at = 0.0  # when an open breaker lets a probe go (clock time)
        self._cooldown_s = cooldown_s
        self._probing = False
        self._clock = clock
        self._on_change = on_change

    def turn(self) -> Turn | None:
        """Whether a send may start now, and as what; None while open (or while the probe runs)."""
        if self.state is State.CLOSED:
            return Turn.SEND
        if self.state is State.OPEN and self._clock() >= self.retry_at:
            self._set(State.HALF_OPEN)
        if self.state is State.HALF_OPEN and not self._probing:
            self._probing = True
            return Turn.PROBE
        return None

    def admits_new(self) -> bool:
        """Whether a new message may be taken to send: always when closed; when the cool-down is over
        and no probe is out, one, to be the probe."""
        if self.state is State.CLOSED:
            return True
        return not self._probing and self._clock() >= self.retry_at

    def wait_s(self) -> float:
        """How long a send that got no turn waits before asking again."""
        return max(0.05, self.retry_at - self._clock()) if self.state is State.OPEN else 0.05

    def abandoned(self, turn: Turn) -> None:
        """A send that got `turn` never reached the endpoint (its lease ended first)."""
        if turn is Turn.PROBE:
            self._probing = False

    def record(self, turn: Turn, status: int | None, ok: bool) -> bool:
        """The outcome of a send that had `turn`; whether it counts as an attempt of its message."""
        if turn is Turn.PROBE:
            self._probing = False
        up = ok or not endpoint_failure(status)
        if self.state is State.CLOSED and self.ratio is not None:
            self.window.add(not up)
        if up:
            self.run = 0
            if self.state is not State.CLOSED:
                self._cooldown_s = self.base_cooldown_s
                self._set(State.CLOSED)
            return True
        self.run += 1
        if turn is Turn.PROBE:
            self._open(min(MAX_COOLDOWN_S, self._cooldown_s * 2))
            return False
        if self.state is not State.CLOSED:
            return False  # sent before it opened: the endpoint's fault, not the message's
        if (self.failures and self.run >= self.failures) or self._share_too_high():
            self._open(self._cooldown_s)
            return False
        return True

    def _share_too_high(self) -> bool:
        if self.ratio is None:
            return False
        attempts, failures = self.window.counts()
        return attempts >= self.min_requests and failures >= self.ratio * attempts

    def _open(self, cooldown_s: float) -> None:
        self.window.clear()  # once closed again, the share counts from then on
        self._cooldown_s = cooldown_s
        self.retry_at = self._clock() + cooldown_s
        self._set(State.OPEN)

    def _set(self, state: State) -> None:
        if state is not self.state:
            self.state = state
            self._on_change(state)
