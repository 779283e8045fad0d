"""The CPU priority of delta-rs's runtime threads, below the server's own.

delta-rs commits (and encodes the system tables' Parquet; the flusher encodes the topic tables'
itself, tables/parquet_files.py) on its tokio threads, which hold no Python lock. On a small
machine under a flood they compete for the cores with the event loop, which every produce waits
for, and keep it waiting runnable. Lowering their priority, as RocksDB lowers its compaction
threads', lets the loop and the WAL writer run first when the CPU is full; when it is not, the
scheduler gives every thread all it asks for
(docs/decisions/0020-delta-rs-threads-run-below-the-event-loop.md). A flusher that then falls
behind grows the WAL backlog, which `max_backlog_bytes` bounds (429), so produce slows down before
memory grows without end.

Only those threads are lowered: a Python thread holds the GIL while it runs, and one preempted
for its low priority would stall the event loop waiting for that lock. tokio starts threads as
it needs them (and a thread inherits its creator's priority, which may be a Python thread's), so
`refresh` looks for new ones; it is cheap and throttled. Linux only: elsewhere it does nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

TOKIO_THREAD_NAMES = frozenset({"tokio-rt-worker", "tokio-runtime-w"})  # tokio's names, as /proc shows them
REFRESH_EVERY_S = 1.0
_TASKS = Path("/proc/self/task")


def lower_runtime_threads(nice: int, done: set[int]) -> list[int]:
    """Set each tokio thread of this process not in `done` to at least niceness `nice`; the thread
    ids changed. `done` is updated: the tokio threads seen, less those that ended."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return []
    changed = []
    alive = set()
    for entry in os.scandir(_TASKS):
        tid = int(entry.name)
        alive.add(tid)
        if tid in done:
            continue
        try:  # a thread is named just after it starts: one not named yet is read again next time
            if Path(entry.path, "comm").read_text().rstrip("\n") not in TOKIO_THREAD_NAMES:
                continue
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed.append(tid)
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended while we looked
        done.add(tid)
    done &= alive  # the kernel reuses the ids of ended threads
    return changed


class RuntimePriority:
    """Keeps delta-rs's threads at `nice`: `refresh` at most every REFRESH_EVERY_S."""

    def __init__(self, nice: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.nice = nice
        self._clock = clock
        self._done: set[int] = set()
        self._next = 0.0

    def refresh(self) -> bool:
        """Lower any new runtime thread, unless done within the last REFRESH_EVERY_S; whether it looked."""
        now = self._clock()
        if self.nice <= 0 or now < self._next:
            return False
        self._next = now + REFRESH_EVERY_S
        lower_runtime_threads(self.nice, self._done)
        return True
