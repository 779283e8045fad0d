"""The read-ahead buffer of a partition pipeline and the ordering rule it keeps.

`take()` hands out the next unit to POST (up to `batch_size` rows) and `release()` is called
once that unit is done (acknowledged or dead-lettered). The rule, per subscription ordering:

- `partition`: one unit in flight per partition; everything waits behind it.
- `key` (the default): one unit in flight per key; a message whose key is busy waits in that
  key's queue without holding up other keys. Keyless messages share one queue: among themselves
  they keep partition order.
- `none`: no rule; only the in-flight window limits.

Each row is looked at once when it arrives at the head of the buffer and moved at most once (to
its key's queue), so the cost per message stays constant however many keys are busy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lakebroker.tables.subscriptions import Ordering

Row = dict[str, Any]


@dataclass
class Unit:
    rows: list[Row]
    keys: set[Any] = field(default_factory=set)


class DispatchQueue:
    def __init__(self, ordering: Ordering, batch_size: int) -> None:
        self.ordering = ordering
        self.batch_size = batch_size
        self._pending: deque[Row] = deque()  # read, in offset order, not looked at yet
        self._waiting: dict[Any, deque[Row]] = {}  # per busy key, its next rows in offset order
        self._ready: deque[tuple[Any, Row]] = deque()  # heads of waiting queues whose key came free
        self._busy: set[Any] = set()  # keys with a unit in flight or a row in `_ready`
        self._held = 0  # rows in `_waiting`

    def __len__(self) -> int:
        return len(self._pending) + len(self._ready) + self._held

    def extend(self, rows: list[Row]) -> None:
        self._pending.extend(rows)

    def key(self, row: Row) -> Any:
        if self.ordering is Ordering.PARTITION:
            return None
        if self.ordering is Ordering.KEY:
            return ("k", row["key"])  # None: the keyless messages' shared key
        return ("o", row["offset"])  # unordered: its own key

    def take(self) -> Unit | None:
        unit = Unit([])
        while len(unit.rows) < self.batch_size:
            if self._ready:  # older than anything pending; its key is reserved for it
                key, row = self._ready.popleft()
            elif self._pending:
                row = self._pending[0]
                key = self.key(row)
                # A busy key's row waits, unless this unit already carries the key and nothing of it
                # waits (then it travels in the same POST, after its predecessor).
                if key in self._busy and (key not in unit.keys or key in self._waiting):
                    if self.ordering is Ordering.PARTITION:
                        break
                    self._pending.popleft()
                    self._waiting.setdefault(key, deque()).append(row)
                    self._held += 1
                    continue
                self._pending.popleft()
            else:
                break
            unit.rows.append(row)
            unit.keys.add(key)
        if not unit.rows:
            return None
        self._busy.update(unit.keys)
        return unit

    def release(self, unit: Unit) -> None:
        for key in unit.keys:
            queue = self._waiting.get(key)
            if not queue:
                self._busy.discard(key)
                continue
            self._ready.append((key, queue.popleft()))  # the key stays busy: reserved for this row
            self._held -= 1
            if not queue:
                del self._waiting[key]
