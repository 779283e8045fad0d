"""Small state tables rewritten whole under optimistic concurrency.

Topic config, subscriptions and delivery leases are a few rows each. A change reads the
table, computes the new rows, and overwrites it in one commit. Delta refuses an overwrite
whose read data a concurrent commit replaced, so two writers can never silently undo each
other: the loser re-reads and re-applies its change (compare-and-swap on the table version).

A StateTable keeps the snapshot it last read, and its rows. Before each use it looks for the
next commit file, and catches up only if there is one: a delivery worker reads these tables at
every heartbeat, and reloading one lists its whole log (30-40 ms of CPU at 80 commits, and a
lease table takes a commit per heartbeat).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from tables import delta
from tables.errors import StorageUnavailable

Rows = list[dict[str, Any]]
T = TypeVar("T")


class StateTable:
    def __init__(self, uri: str, schema: pa.Schema, version: int) -> None:
        self.uri = uri
        self.schema = schema
        self.version = version
        self._lock = threading.Lock()  # one snapshot, shared by the threads of a server
        self._table: DeltaTable | None = None
        self._rows: pa.Table | None = None  # the snapshot's rows, read once per version
        self._ensured = False  # created and migrated to `version` (once per process)

    def read(self) -> Rows:
        with self._lock:
            rows = self._current(create=False)
            return [] if rows is None else rows.to_pylist()

    def mutate(self, change: Callable[[Rows], tuple[Rows, T]], attempts: int = 50) -> T:
        """Apply `change(rows) -> (new_rows, result)` atomically; retried on a concurrent commit."""
        for attempt in range(attempts):
            with self._lock:
                data = self._current(create=True)
                assert data is not None and self._table is not None
                rows = data.to_pylist()
                new_rows, result = change(rows)
                if new_rows == rows:
                    return result
                try:
                    write_deltalake(self._table, pa.Table.from_pylist(new_rows, schema=self.schema), mode="overwrite",
                                    commit_properties=CommitProperties(max_commit_retries=0))
                except CommitFailedError:
                    pass  # the next attempt catches up with the winner's commit
                else:
                    return result
                finally:
                    self._rows = None  # whoever won, these rows are no longer the newest
            time.sleep(random.uniform(0, 0.01 * (attempt + 1)))
        raise StorageUnavailable(f"could not update {self.uri}: {attempts} concurrent writers won in a row")

    def _current(self, *, create: bool) -> pa.Table | None:
        """The newest rows (None: no table and not `create`). Under the lock."""
        try:
            if create and not self._ensured:
                self._table = delta.ensure_table(self.uri, self.schema, partition_by=None, version=self.version)
                self._ensured, self._rows = True, None
            elif self._table is None:
                self._table = delta.open_table(self.uri)
                if self._table is None:
                    return None
                self._rows = None
            elif self._rows is None or delta.has_commit(self.uri, self._table.version() + 1):
                self._table.update_incremental()
                self._rows = None
            if self._rows is None:
                self._rows = self._table.to_pyarrow_table()
            return self._rows
        except Exception:
            self._table, self._rows, self._ensured = None, None, False  # start afresh next time
            raise

    def compact_log(self) -> None:
        """Checkpoint and drop old log files: these tables take many tiny commits."""
        table = delta.load(self.uri)
        table.create_checkpoint()
        table.cleanup_metadata()
