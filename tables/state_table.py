"""Small state tables rewritten whole under optimistic concurrency.

Topic config, subscriptions and delivery leases are a few rows each. A change reads the
table, computes the new rows, and overwrites it in one commit. Delta refuses an overwrite
whose read data a concurrent commit replaced, so two writers can never silently undo each
other: the loser re-reads and re-applies its change (compare-and-swap on the table version).

A StateTable keeps the snapshot it last read, and its rows. Before each use it looks for the
next commit file, and catches up only if there is one: a delivery worker reads these tables at
every heartbeat, and reloading one lists its whole log, which a lease table grows by a commit per
heartbeat (docs/decisions/0018-readers-follow-delta-logs-commit-by-commit.md).

Each state table keeps its log and replaced files an hour (STATE_TABLE_PROPERTIES): delta-rs
drops old commit files after each checkpoint, and the writer of each checkpointed version
vacuums. A snapshot not confirmed for RECHECK_AFTER_S is reloaded whole rather than trusted to
"no next commit file", since after an hour that file may be one the cleanup removed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from lakebroker.tables import delta
from lakebroker.tables.conflicts import retry_conflicts
from lakebroker.tables.schemas import STATE_TABLE_PROPERTIES

Rows = list[dict[str, Any]]
T = TypeVar("T")

RECHECK_AFTER_S = 300.0  # well inside the hour STATE_TABLE_PROPERTIES keeps commit files (delta.Follower)

log = logging.getLogger(__name__)


class StateTable:
    def __init__(self, uri: str, schema: pa.Schema, version: int, *,
                 properties: Mapping[str, str] = STATE_TABLE_PROPERTIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.uri = uri
        self.schema = schema
        self.version = version
        self.properties = properties
        self._vacuum_every = int(properties.get("delta.checkpointInterval", "100"))  # after each log cleanup
        self._lock = threading.Lock()  # one snapshot, shared by the threads of a server
        self._snapshot = delta.Follower(uri, recheck_after_s=RECHECK_AFTER_S, clock=clock)
        self._data: pa.Table | None = None  # the snapshot's rows, read once per version
        self._ensured = False  # created, migrated to `version` and given `properties` (once per process)

    def read(self) -> Rows:
        with self._lock:
            rows = self._current(create=False)
            return [] if rows is None else rows.to_pylist()

    def mutate(self, change: Callable[[Rows], tuple[Rows, T]], attempts: int = 50) -> T:
        """Apply `change(rows) -> (new_rows, result)` atomically; retried on a concurrent commit."""

        def once() -> T:
            with self._lock:
                data = self._current(create=True)
                table = self._snapshot.table
                assert data is not None and table is not None
                rows = data.to_pylist()
                new_rows, result = change(rows)
                if new_rows == rows:
                    return result
                try:
                    # On success the write moves `table` to its commit; on failure the next
                    # attempt's follow() finds the winner's commit file and catches up.
                    write_deltalake(table, pa.Table.from_pylist(new_rows, schema=self.schema), mode="overwrite",
                                    commit_properties=CommitProperties(max_commit_retries=0),
                                    post_commithook_properties=delta.commit_hooks(table))
                finally:
                    self._data = None  # whoever won, these rows are no longer the newest
                self._maintain(table)
                return result

        return retry_conflicts(once, what=f"updating {self.uri}", attempts=attempts, pause_s=0.01)

    def _current(self, *, create: bool) -> pa.Table | None:
        """The newest rows (None: no table and not `create`). Under the lock."""
        try:
            if create and not self._ensured:
                self._snapshot.adopt(delta.ensure_table(self.uri, self.schema, partition_by=None, version=self.version,
                                                        properties=self.properties))
                self._ensured, self._data = True, None
            elif self._snapshot.follow():
                self._data = None
            table = self._snapshot.table
            if table is None:
                return None
            if self._data is None:
                self._data = table.to_pyarrow_table()
            return self._data
        except Exception:
            self._snapshot.forget()  # start afresh next time
            self._data, self._ensured = None, False
            raise

    def _maintain(self, table: DeltaTable) -> None:
        """After our commit: the writer of a checkpointed version deletes the data files that
        overwrites replaced more than the table's deletedFileRetentionDuration ago."""
        if table.version() % self._vacuum_every:
            return
        try:
            # A full vacuum (a listing): the checkpoint just written already dropped the expired
            # tombstones, so the log alone no longer names the files to delete.
            table.vacuum(dry_run=False, full=True)
        except (DeltaError, OSError) as exc:  # maintenance must never fail the change that triggered it
            log.warning("could not vacuum %s: %s", self.uri, exc)
