"""Turns: CPU-heavy request sections (a batch's parse, partitioning and WAL hand-off) run one per
pass of the event loop, so the light requests that became ready meanwhile run between them.

An event loop runs every callback that is ready at the start of a pass before it polls sockets
again, so batch requests that arrive together would run back to back, and a single-message
request that arrived during the first one would wait for all of them: a closed-loop batch producer
with many connections would starve single-message producers
(docs/decisions/0008-batches-take-turns-with-single-messages.md). A turn is granted by a callback
that wakes one waiter and schedules the next grant behind it, so grants are one pass apart and
first come, first served.

A caller that finds no turn taken in this pass and nobody waiting takes its turn at once: a few
batch connections seldom meet in one pass, and a wait would cost each request two passes of the
loop, each behind the other connections' reads.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Turns:
    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._granting = False  # waiters are queued and a grant is scheduled
        self._taken = 0  # a turn runs in this pass while nonzero: the pass's generation
        self._generation = 0

    async def wait(self) -> None:
        """Return at this caller's turn: one caller's turn per pass of the loop."""
        loop = asyncio.get_running_loop()
        if not self._taken and not self._granting:
            loop.call_soon(self._release, self._take())
            return
        future: asyncio.Future[None] = loop.create_future()
        self._waiting.append(future)
        if not self._granting:
            self._granting = True
            loop.call_soon(self._grant)
        await future

    def _take(self) -> int:
        """Mark a turn taken; its generation, for the release a later pass makes."""
        self._generation += 1
        self._taken = self._generation
        return self._generation

    def _release(self, generation: int) -> None:
        if self._taken == generation:
            self._taken = 0

    def _release_next_pass(self, generation: int) -> None:
        asyncio.get_running_loop().call_soon(self._release, generation)

    def _grant(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():  # a cancelled waiter gives its turn to the next one
                future.set_result(None)
                # it runs in the next pass: the turn is taken until the pass after that
                loop.call_soon(self._release_next_pass, self._take())
                break
        if self._waiting:
            loop.call_soon(self._grant)
        else:
            self._granting = False
