"""Where a subscription's group stands in one partition: pure bookkeeping, no I/O and no asyncio.

- the *committed* offset is the next offset to deliver as the offsets table has it;
- the *position* is the next offset not yet done: everything below it is acknowledged by a 2xx,
  dead-lettered, or absent because key compaction removed it;
- offsets done out of order (a later message acknowledged first) wait above the position until
  the run below them is done, so the position never passes an offset that is not.
"""

from __future__ import annotations

from collections.abc import Iterable


class PositionTracker:
    def __init__(self, start: int) -> None:
        self.committed = start
        self.position = start
        self._done: set[int] = set()

    def done(self, offsets: Iterable[int]) -> None:
        """These offsets need nothing more; the position moves over any run they complete."""
        self._done.update(offsets)
        position = self.position
        while position in self._done:
            self._done.discard(position)
            position += 1
        self.position = position

    def jump(self, offset: int) -> None:
        """The group was moved to `offset` and that was committed (a retention skip, a reset):
        nothing done past the old position counts any more."""
        self.position = self.committed = offset
        self._done.clear()

    def to_commit(self) -> int | None:
        """The position, if the offsets table does not have it yet."""
        return None if self.position == self.committed else self.position

    def was_committed(self, position: int) -> None:
        self.committed = max(self.committed, position)
