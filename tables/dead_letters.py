"""Dead letters: messages a subscription gave up on, in `_system/dead_letters`.

A row points at the message (topic, partition, offset) rather than copying it: the topic
table holds the payload. Replay marks rows; the owning delivery worker redelivers them
and stamps `replayed_at`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import DEAD_LETTERS_SCHEMA, DEAD_LETTERS_SCHEMA_VERSION


@dataclass(frozen=True)
class DeadLetter:
    group: str
    topic: str
    partition: int
    offset: int
    attempts: int
    last_status: int | None
    last_error: str | None

    @classmethod
    def from_exhausted_retries(cls, group: str, topic: str, partition: int, offset: int, attempts: int,
                               last_status: int | None, last_error: str | None) -> DeadLetter:
        return cls(group, topic, partition, offset, attempts, last_status, (last_error or "")[:2000] or None)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class DeadLetterTable:
    def __init__(self, layout: Layout) -> None:
        self.uri = layout.dead_letters_table
        # A delivery worker asks for replay requests every second; the answer changes only with a
        # commit, so it is kept with the snapshot it came from (pending_replays_all).
        self._followed = delta.Follower(self.uri)
        self._lock = threading.Lock()
        self._pending: tuple[frozenset[str], dict[tuple[str, int], list[int]]] | None = None

    def _open(self) -> DeltaTable:
        return delta.ensure_table(self.uri, DEAD_LETTERS_SCHEMA, partition_by=None, version=DEAD_LETTERS_SCHEMA_VERSION)

    def add(self, letters: list[DeadLetter]) -> None:
        if not letters:
            return
        now = datetime.now(UTC)
        rows = [{**letter.__dict__, "dead_at": now, "replay_requested_at": None, "replayed_at": None}
                for letter in letters]
        delta.append(self._open(), pa.Table.from_pylist(rows, schema=DEAD_LETTERS_SCHEMA),
                     metadata={"lakebroker.operation": "dead-letter"})

    def letters(self, group: str, *, limit: int = 100, partition: int | None = None,
             include_replayed: bool = False) -> list[dict[str, Any]]:
        table = delta.open_table(self.uri)
        if table is None:
            return []
        flt = pc.field("group") == group
        if partition is not None:
            flt = flt & (pc.field("partition") == partition)
        if not include_replayed:
            flt = flt & pc.field("replayed_at").is_null()
        rows = delta.read_rows(table, flt).sort_by([("partition", "ascending"), ("offset", "ascending")])
        out: list[dict[str, Any]] = rows.slice(0, limit).to_pylist()
        return out

    def count(self, group: str) -> int:
        return len(self.letters(group, limit=10**9))

    def unreplayed(self, limit_per_group: int = 0) -> dict[str, tuple[int, list[dict[str, Any]]]]:
        """Per group, in one read: how many letters are not yet replayed, and the first
        `limit_per_group` of them by partition and offset."""
        table = delta.open_table(self.uri)
        if table is None:
            return {}
        rows = delta.read_rows(table, pc.field("replayed_at").is_null())
        out: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        for r in rows.group_by("group").aggregate([([], "count_all")]).to_pylist():
            first: list[dict[str, Any]] = []
            if limit_per_group > 0:
                mine = rows.filter(pc.field("group") == r["group"])
                first = mine.sort_by([("partition", "ascending"), ("offset", "ascending")]).slice(
                    0, limit_per_group).to_pylist()
            out[str(r["group"])] = (int(r["count_all"]), first)
        return out

    def request_replay(self, group: str, *, partition: int | None = None, from_offset: int | None = None,
                       to_offset: int | None = None) -> int:
        """Mark matching, not yet replayed letters for redelivery; returns how many."""
        predicate = [f"\"group\" = {_quote(group)}", "replayed_at IS NULL", "replay_requested_at IS NULL"]
        if partition is not None:
            predicate.append(f"\"partition\" = {int(partition)}")
        if from_offset is not None:
            predicate.append(f"\"offset\" >= {int(from_offset)}")
        if to_offset is not None:
            predicate.append(f"\"offset\" <= {int(to_offset)}")
        table = delta.open_table(self.uri)
        if table is None:
            return 0
        metrics = table.update(updates={"replay_requested_at": "now()"}, predicate=" AND ".join(predicate))
        return int(metrics.get("num_updated_rows", 0))

    def pending_replays_all(self, groups: set[str]) -> dict[tuple[str, int], list[int]]:
        """Replay requests of these groups, by (group, partition): one read for a whole worker, and
        none while the table has no new commit (one stat)."""
        with self._lock:
            return self._pending_replays(frozenset(groups))

    def _pending_replays(self, asked: frozenset[str]) -> dict[tuple[str, int], list[int]]:
        changed = self._followed.follow()
        table = self._followed.table
        if table is None or not asked:
            return {}
        if not changed and self._pending is not None and self._pending[0] == asked:
            return {pair: list(offsets) for pair, offsets in self._pending[1].items()}
        flt = (pc.field("group").isin(sorted(asked)) & pc.field("replay_requested_at").is_valid()
               & pc.field("replayed_at").is_null())
        out: dict[tuple[str, int], list[int]] = {}
        for r in delta.read_rows(table, flt, columns=["group", "partition", "offset"]).to_pylist():
            out.setdefault((r["group"], r["partition"]), []).append(r["offset"])
        found = {k: sorted(v) for k, v in out.items()}
        self._pending = (asked, found)
        return {pair: list(offsets) for pair, offsets in found.items()}

    def pending_replays(self, group: str, partition: int) -> list[int]:
        table = delta.open_table(self.uri)
        if table is None:
            return []
        flt = ((pc.field("group") == group) & (pc.field("partition") == partition)
               & pc.field("replay_requested_at").is_valid() & pc.field("replayed_at").is_null())
        return sorted(delta.read_rows(table, flt, columns=["offset"])["offset"].to_pylist())

    def mark_replayed(self, group: str, partition: int, offsets: list[int]) -> None:
        if not offsets:
            return
        table = self._open()
        listed = ", ".join(str(int(o)) for o in offsets)
        table.update(updates={"replayed_at": "now()"},
                     predicate=f"\"group\" = {_quote(group)} AND \"partition\" = {int(partition)} "
                               f"AND \"offset\" IN ({listed}) AND replayed_at IS NULL")

    def replay_failed(self, group: str, partition: int, offset: int, status: int | None, error: str | None) -> None:
        """The replay attempt failed: the letter stays dead, with the new error, until replayed again."""
        table = self._open()
        updates = {"replay_requested_at": "NULL", "attempts": "attempts + 1",
                   "last_status": "NULL" if status is None else str(int(status)),
                   "last_error": _quote((error or "")[:2000])}
        table.update(updates=updates, predicate=f"\"group\" = {_quote(group)} AND \"partition\" = {int(partition)} "
                                                f"AND \"offset\" = {int(offset)} AND replayed_at IS NULL")
