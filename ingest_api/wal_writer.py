"""The WAL writer thread of group commit (group_commit.py): writes the groups handed to it, as few
writes as their arrival allows, and reports each write on the event loop."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from lakebroker.ingest_api.chunks import Chunk, chunk_frame
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.wal import Wal

if TYPE_CHECKING:
    from typing_extensions import Buffer


class Group(Protocol):
    """What the writer needs of a group: its frames and records, its epoch, whether to fdatasync."""

    @property
    def frames(self) -> Sequence[bytes | Chunk]: ...

    @property
    def records(self) -> Sequence[Record | Chunk]: ...

    @property
    def epoch(self) -> int: ...

    @property
    def sync(self) -> bool: ...


G = TypeVar("G", bound=Group)


class WalWriter(threading.Thread, Generic[G]):
    """Writes the groups handed to it, as few writes as their arrival allows, and reports each write
    on the loop. After a failed write it drops every group of the same epoch (handed before the loop
    heard of the failure: their offsets follow the failed ones), and the loop fails those."""

    def __init__(self, wal: Wal, loop: asyncio.AbstractEventLoop,
                 written: Callable[[list[G], BaseException | None, float], None],
                 stopped: Callable[[], None]) -> None:
        super().__init__(name="wal-writer", daemon=True)
        self.groups: queue.SimpleQueue[G | None] = queue.SimpleQueue()  # None: stop
        self._wal, self._loop, self._written, self._stopped = wal, loop, written, stopped

    def run(self) -> None:
        failed_epoch = -1
        stop = False
        while not stop:
            taken = [self.groups.get()]
            while not self.groups.empty():
                taken.append(self.groups.get_nowait())
            stop = None in taken
            groups = [g for g in taken if g is not None and g.epoch > failed_epoch]
            if not groups:
                continue
            error: BaseException | None = None
            started = time.perf_counter()
            try:
                frames = wal_pieces(f for g in groups for f in g.frames)
                self._wal.append(frames, [r for g in groups for r in g.records], sync=any(g.sync for g in groups))
            except BaseException as exc:  # noqa: BLE001 - any failure means: not durable, roll back
                error, failed_epoch = exc, groups[-1].epoch
            if not self._report(self._written, groups, error, time.perf_counter() - started):
                return
        self._report(self._stopped)

    def _report(self, callback: Callable[..., None], *args: object) -> bool:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed (the process is going away without a stop)
            return False
        return True


def wal_pieces(frames: Iterable[bytes | Chunk]) -> list[Buffer]:
    """What the WAL writes for these frames: a record's frame, or a chunk's frame in its pieces."""
    out: list[Buffer] = []
    for frame in frames:
        if isinstance(frame, bytes):
            out.append(frame)
        else:
            out.extend(chunk_frame(frame))
    return out
