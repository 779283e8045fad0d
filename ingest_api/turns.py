"""Turns: CPU-heavy request sections (a batch's parse, partitioning and WAL hand-off) run one per
pass of the event loop, so the light requests that became ready meanwhile run between them.

An event loop runs every callback that is ready at the start of a pass before it polls sockets
again. Without turns, 32 batch requests that arrive together run back to back, ~5 ms each, and a
single-message request that arrived during the first one waits for all of them: a closed-loop
batch producer with many connections starves single-message producers (issue 11, item 4). A
turn is granted by a callback that wakes one waiter and schedules the next grant behind it, so
grants are one pass apart and first come, first served.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Turns:
    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._granting = False

    async def wait(self) -> None:
        """Return at this caller's turn: at most one caller returns per pass of the loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiting.append(future)
        if not self._granting:
            self._granting = True
            loop.call_soon(self._grant)
        await future

    def _grant(self) -> None:
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():  # a cancelled waiter gives its turn to the next one
                future.set_result(None)
                break
        if self._waiting:
            asyncio.get_running_loop().call_soon(self._grant)
        else:
            self._granting = False
