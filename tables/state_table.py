"""Small state tables rewritten whole under optimistic concurrency.

Topic config, subscriptions and delivery leases are a few rows each. A change reads the
table, computes the new rows, and overwrites it in one commit. Delta refuses an overwrite
whose read data a concurrent commit replaced, so two writers can never silently undo each
other: the loser re-reads and re-applies its change (compare-and-swap on the table version).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake
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

    def read(self) -> Rows:
        table = delta.open_table(self.uri)
        return [] if table is None else table.to_pyarrow_table().to_pylist()

    def mutate(self, change: Callable[[Rows], tuple[Rows, T]], attempts: int = 50) -> T:
        """Apply `change(rows) -> (new_rows, result)` atomically; retried on a concurrent commit."""
        for attempt in range(attempts):
            table = delta.ensure_table(self.uri, self.schema, partition_by=None, version=self.version)
            rows = table.to_pyarrow_table().to_pylist()
            new_rows, result = change(rows)
            if new_rows == rows:
                return result
            try:
                write_deltalake(table, pa.Table.from_pylist(new_rows, schema=self.schema), mode="overwrite",
                                commit_properties=CommitProperties(max_commit_retries=0))
            except CommitFailedError:
                time.sleep(random.uniform(0, 0.01 * (attempt + 1)))
                continue
            return result
        raise StorageUnavailable(f"could not update {self.uri}: {attempts} concurrent writers won in a row")

    def compact_log(self) -> None:
        """Checkpoint and drop old log files: these tables take many tiny commits."""
        table = delta.load(self.uri)
        table.create_checkpoint()
        table.cleanup_metadata()
