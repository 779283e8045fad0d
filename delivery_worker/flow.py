"""Flow control per endpoint: a token-bucket rate limit and an adaptive in-flight window."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class ByteBudget:
    """Bytes of messages read ahead and not yet done, shared by every pipeline of a process (on
    its event loop): what `delivery_read_ahead_total_bytes` bounds."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def room(self) -> int:
        return self.limit - self.used


class TokenBucket:
    """At most `rate` sends per second on average, with bursts of at most `burst`. `clock` and
    `sleep` are the event loop's own unless a test gives its schedule's."""

    def __init__(self, rate: float | None, burst: float | None = None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else (rate or 1) / 10)
        self._clock, self._sleep = clock, sleep
        self._tokens = self.burst
        self._stamp = clock()
        self._lock = asyncio.Lock()

    async def take(self, n: int = 1) -> None:
        if self.rate is None:
            return
        async with self._lock:  # first come, first served
            while True:
                now = self._clock()
                self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
                self._stamp = now
                if self._tokens >= n or (n > self.burst and self._tokens >= self.burst):
                    self._tokens -= n
                    return
                await self._sleep((min(n, self.burst) - self._tokens) / self.rate)


class AdaptiveWindow:
    """How many sends may be outstanding: starts at 1, grows by one per success up to the
    maximum, halves on a failure (as Pub/Sub push does), so a struggling endpoint gets less."""

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.size = 1
        self.in_flight = 0
        self._changed = asyncio.Condition()

    async def acquire(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight < self.size)
            self.in_flight += 1

    async def release(self, success: bool) -> None:
        async with self._changed:
            self.in_flight -= 1
            self.size = min(self.maximum, self.size + 1) if success else max(1, self.size // 2)
            self._changed.notify_all()

    async def give_back(self) -> None:
        """Return a slot that was never used for a send (its task was cancelled before it ran)."""
        async with self._changed:
            self.in_flight -= 1
            self._changed.notify_all()

    def has_room(self) -> bool:
        return self.in_flight < self.size
