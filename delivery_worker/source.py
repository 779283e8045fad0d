"""Reads a partition's committed messages from its topic table (blocking; run in a thread)."""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable

from tables import delta
from tables.schemas import TOPIC_SCHEMA


class PartitionSource:
    def __init__(self, table_uri: str, partition: int) -> None:
        self.uri = table_uri
        self.partition = partition
        self._table: DeltaTable | None = None
        self._dataset: tuple[int, pads.Dataset] | None = None  # (table version, this partition's files)

    def _refresh(self) -> DeltaTable | None:
        if self._table is None:
            self._table = delta.open_table(self.uri)
        else:
            self._table.update_incremental()
        return self._table

    def log_end(self) -> int:
        """Offsets below this are committed to the table (the flusher's txn version)."""
        table = self._refresh()
        if table is None:
            return 0
        return delta.txn_version(table, delta.partition_app_id(self.partition)) or 0

    def log_start(self, log_end: int) -> int:
        table = self._refresh()
        files = None if table is None else delta.partition_files(table).get(self.partition)
        return log_end if files is None or files.min_offset is None else int(files.min_offset)

    def read(self, start: int, end: int) -> list[dict[str, Any]]:
        """Rows with start <= offset < end, in offset order (may have holes after key compaction)."""
        table = self._table
        if table is None or start >= end:
            return []
        version = table.version()
        if self._dataset is None or self._dataset[0] != version:
            self._dataset = (version, delta.partition_dataset(table, self.partition))
        rows = self._dataset[1].to_table(
            filter=(pc.field("offset") >= start) & (pc.field("offset") < end), columns=TOPIC_SCHEMA.names,
        ).sort_by("offset")
        out: list[dict[str, Any]] = rows.to_pylist()
        return out

    def read_offsets(self, offsets: list[int]) -> list[dict[str, Any]]:
        table = self._refresh()
        if table is None or not offsets:
            return []
        rows = delta.read_rows(
            table, (pc.field("partition") == self.partition) & pc.field("offset").isin(offsets),
            columns=TOPIC_SCHEMA.names,
        ).sort_by("offset")
        out: list[dict[str, Any]] = rows.to_pylist()
        return out
