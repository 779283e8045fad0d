"""A delivery worker as the main task of its process: `lakebroker deliver`, or serve's child.

SIGTERM or SIGINT stops it gracefully (offsets committed, leases released). A worker started
by `serve` also stops when its parent is gone, so a `serve` that was killed leaves no orphan
delivering beside the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys

from lakebroker.delivery_worker.worker import DeliveryWorker

log = logging.getLogger(__name__)
PARENT_CHECK_S = 0.5
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux for SIGTERM when the parent exits; exit now if it already has (the request
    only covers a parent alive when it is made). Elsewhere the watch in `run_until_stopped` does it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        raise SystemExit(f"parent {parent_pid} is gone before the delivery worker started")


async def _watch_parent(parent_pid: int, main: asyncio.Task[None]) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(PARENT_CHECK_S)
    log.warning("parent process %d is gone: stopping the delivery worker", parent_pid)
    main.cancel()


async def run_until_stopped(worker: DeliveryWorker, parent_pid: int | None = None) -> None:
    main = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):  # stop gracefully: commit offsets, release leases
        loop.add_signal_handler(signum, main.cancel)
    watch = None if parent_pid is None else asyncio.create_task(_watch_parent(parent_pid, main))
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await main
    finally:
        if watch is not None:
            watch.cancel()
