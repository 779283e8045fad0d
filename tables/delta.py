"""The one place that reads and writes Delta tables from Python (delta-rs).

Spark jobs commit to the same tables through spark_pipeline/session.py, whose LogStores make
its commits put-if-absent, like delta-rs's (locally and on S3, tables/storage.py); both sides then
resolve conflicts the way Delta defines, and neither can overwrite the other's commit.

A table URI is a local path or an s3:// (s3a://) URI: `load` and `exists` are how the rest of the
code opens one, so every open gets the storage options of its URI.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.schema import Schema
from deltalake.transaction import AddAction, RemoveAction

from lakebroker.tables import parquet_files, storage
from lakebroker.tables.schemas import HOT_PATH_TABLE_PROPERTIES, SCHEMA_VERSION_PROPERTY

if TYPE_CHECKING:  # pyarrow.dataset imports pandas, which every CLI start would pay for (docs/decisions/0013)
    import pyarrow.dataset as pads


def load(uri: str, version: int | None = None) -> DeltaTable:
    """Open a table (at a version, or the latest) with its URI's storage options."""
    return DeltaTable(uri, version=version, storage_options=storage.delta_options(uri))


def exists(uri: str) -> bool:
    return bool(DeltaTable.is_deltatable(uri, storage_options=storage.delta_options(uri)))


def vacuum_candidates(uri: str, hours: float) -> list[str] | None:
    """The files a VACUUM retaining `hours` could delete (tombstoned and orphaned alike), from a
    listing only; None if delta-rs cannot tell (an unsupported store or table feature).

    The hours are rounded down, so the answer never misses a file that VACUUM would delete.
    Hidden files are left out, as Delta's VACUUM leaves them: delta-rs's full listing counts the
    `.crc` checksums Spark writes beside each data file, which would make every table of a Spark
    job look like it had something to delete. So are files already gone: delta-rs names every
    tombstone still in the log (a week of them by default) whether or not an earlier VACUUM
    deleted its file, which made every later job run VACUUM again for nothing."""
    try:
        found = load(uri).vacuum(retention_hours=int(hours), dry_run=True, enforce_retention_duration=False,
                                 full=True)
    except (DeltaError, OSError, ValueError):
        return None
    visible = [path for path in found if not any(_hidden(part) for part in path.split("/"))]
    return storage.existing(uri, visible)


def _hidden(name: str) -> bool:
    """Delta's rule for a path component VACUUM never deletes under: `.x` and `_x`, except change
    data and index directories (a partition directory `col=v` of ours never starts with either)."""
    return name.startswith(".") or (name.startswith("_") and not name.startswith(("_change_data", "_delta_index")))


def partition_app_id(partition: int) -> str:
    """The txn appId whose version is a partition's log-end offset (the next offset to assign).

    The flusher writes it in the same commit as the rows, so "which offsets are in the table"
    and "the rows" can never disagree, retention cannot erase the log-end, and a replayed WAL
    record below it is known to be committed already.
    """
    return f"lakebroker.partition.{partition}"


def ensure_table(uri: str, schema: pa.Schema, *, partition_by: list[str] | None, version: int,
                 properties: Mapping[str, str] | None = None) -> DeltaTable:
    """Create the table if it is missing; idempotent, and safe if another process races us.
    `properties` are Delta table properties the table must have: set at create, and set on an
    older table that lacks them (a table created before they were added)."""
    if exists(uri):
        table = load(uri)
    else:
        if not storage.is_s3(uri):
            Path(uri).mkdir(parents=True, exist_ok=True)
        # delta-rs refuses custom (non-`delta.`) properties at create time: the loop below sets them.
        config: dict[str, str | None] = {**HOT_PATH_TABLE_PROPERTIES,
                                         **{k: v for k, v in (properties or {}).items() if k.startswith("delta.")}}
        try:
            table = DeltaTable.create(uri, schema, mode="ignore", partition_by=partition_by, configuration=config,
                                      storage_options=storage.delta_options(uri))
        except CommitFailedError:  # mode="ignore" still loses the race for version 0 with a concurrent create
            table = load(uri)
    # delta-rs refuses custom properties at create time, so the version is a second commit.
    if table.metadata().configuration.get(SCHEMA_VERSION_PROPERTY) is None:
        try:
            table.alter.set_table_properties({SCHEMA_VERSION_PROPERTY: str(version)}, raise_if_not_exists=False)
        except CommitFailedError:
            table = load(uri)  # another process created the table and set it first
    if int(table.metadata().configuration.get(SCHEMA_VERSION_PROPERTY) or version) < version:
        table = _migrate(uri, table, schema, version)
    wanted = dict(properties or {})
    for _ in range(5):  # a busy table's writers can win a few times in a row
        configuration = table.metadata().configuration
        if all(configuration.get(key) == value for key, value in wanted.items()):
            break
        with contextlib.suppress(CommitFailedError, DeltaError):
            table.alter.set_table_properties(wanted, raise_if_not_exists=False)
        table = load(uri)
    return table


def _migrate(uri: str, table: DeltaTable, schema: pa.Schema, version: int) -> DeltaTable:
    """Bring an older table up to `version`. A schema version may only add nullable columns, so
    the migration adds the missing ones (old rows read them as null), then records the version.
    Racing processes are fine: whoever loses re-reads a table the winner migrated."""
    have = {f.name for f in table.schema().fields}
    missing = [f for f in schema if f.name not in have]
    if any(not f.nullable for f in missing):
        raise ValueError(f"{uri}: schema version {version} adds a non-nullable column; it needs its own migration")
    try:
        if missing:
            table.alter.add_columns(Schema.from_arrow(pa.schema(missing)).fields)
        table.alter.set_table_properties({SCHEMA_VERSION_PROPERTY: str(version)}, raise_if_not_exists=False)
    except (CommitFailedError, DeltaError):
        pass  # a concurrent migration (or commit) won; the re-read below shows its result
    return load(uri)


def has_commit(uri: str, version: int) -> bool:
    """Whether the table's log holds commit `version`: one stat (a HEAD on S3), where reloading the
    table lists its whole log. Both writers put a commit file in place whole, and in order."""
    import pyarrow.fs as pafs

    fs, root = storage.filesystem(uri)
    assert isinstance(fs, pafs.FileSystem)
    return bool(fs.get_file_info(f"{root}/_delta_log/{version:020d}.json").type != pafs.FileType.NotFound)


def open_table(uri: str) -> DeltaTable | None:
    return load(uri) if exists(uri) else None


# delta-rs (1.6) keeps an open table's file list as one Arrow batch per commit it applied since it
# was loaded (its own writes and update_incremental alike), and every commit re-scans them all: a
# handle kept open for N commits pays CPU in N at each commit. A fresh load starts from the newest
# checkpoint, so handles kept across commits are reloaded after this many
# (docs/decisions/0009-delta-handles-reloaded-every-50-versions.md).
RELOAD_AFTER_VERSIONS = 50
DELTA_RS_CHECKPOINT_INTERVAL = 100  # delta-rs's default delta.checkpointInterval


def _aged(table: DeltaTable, loaded: int) -> bool:
    """Whether a handle loaded at version `loaded` has applied RELOAD_AFTER_VERSIONS commits since."""
    return table.version() - loaded >= RELOAD_AFTER_VERSIONS


class KeptTable:
    """A table kept open across commits: opened by `opener` on first use, caught up before each
    later use, reloaded every RELOAD_AFTER_VERSIONS versions (see above)."""

    def __init__(self, uri: str, opener: Callable[[], DeltaTable]) -> None:
        self.uri = uri
        self._opener = opener
        self._table: DeltaTable | None = None
        self._loaded = -1  # the version `_table` was loaded at

    def current(self) -> DeltaTable:
        if self._table is None:
            self._table = self._opener()
        elif _aged(self._table, self._loaded):
            self._table = load(self.uri)
        else:
            self._table.update_incremental()
            return self._table
        self._loaded = self._table.version()
        return self._table


class Follower:
    """A table kept open between reads, caught up only when its next commit file exists: one stat
    (one HEAD on S3), where reloading lists the whole log. A snapshot not confirmed for
    `recheck_after_s` is reloaded whole instead, since once a checkpoint's log cleanup has run, a
    missing next commit file may be one the cleanup removed (state tables keep an hour of log); so
    is one RELOAD_AFTER_VERSIONS past its load."""

    def __init__(self, uri: str, *, recheck_after_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.uri = uri
        self.table: DeltaTable | None = None
        self._recheck_after_s = recheck_after_s
        self._clock = clock
        self._confirmed_at = 0.0
        self._loaded = -1  # the version `table` was loaded at

    def follow(self) -> bool:
        """Bring `table` to the newest version (None: no table yet); whether it may have changed."""
        now = self._clock()
        if self.table is None or now - self._confirmed_at > self._recheck_after_s \
                or _aged(self.table, self._loaded):
            self.table = open_table(self.uri)
            self._loaded = -1 if self.table is None else self.table.version()
            changed = True
        elif has_commit(self.uri, self.table.version() + 1):
            self.table.update_incremental()
            changed = True
        else:
            changed = False
        self._confirmed_at = now
        return changed

    def adopt(self, table: DeltaTable) -> None:
        """A table this process just opened or created (so known to be current)."""
        self.table, self._confirmed_at, self._loaded = table, self._clock(), table.version()

    def forget(self) -> None:
        self.table = None


def append(
    table: DeltaTable,
    data: pa.Table,
    *,
    txns: Mapping[str, int] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Append rows, and in the same commit record each txn appId at its version. Row groups are
    bounded (tables/parquet_files.py), so a reader of a few offsets decodes only the ones that hold them."""
    write_deltalake(table, data, mode="append", commit_properties=_commit_properties(txns, metadata),
                    post_commithook_properties=commit_hooks(table),
                    writer_properties=parquet_files.writer_properties(data))


def append_partitions(
    table: DeltaTable,
    parts: Mapping[int, pa.Table],
    *,
    txns: Mapping[str, int] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """`append` for a table partitioned by one column, given each partition value's rows apart:
    one Parquet file per partition, written by pyarrow, then one commit of their add actions and
    the txns. Files a failed commit leaves behind are in no version; VACUUM deletes them."""
    import pyarrow.fs as pafs

    (column,) = table.metadata().partition_columns
    schema = pa.schema(table.schema().to_arrow())
    if wrong := [value for value, rows in parts.items() if not rows.schema.equals(schema)]:
        raise ValueError(f"{table.table_uri}: rows of partitions {wrong} do not have the table's schema")
    fs, root = storage.filesystem(table.table_uri)
    assert isinstance(fs, pafs.FileSystem)
    written = [parquet_files.write_partition_file(fs, root, column, value, rows) for value, rows in parts.items()]
    actions: list[AddAction | RemoveAction] = [
        AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats) for f in written]
    table.create_write_transaction(actions, mode="append", schema=schema, partition_by=[column],
                                   commit_properties=_commit_properties(txns, metadata),
                                   post_commithook_properties=commit_hooks(table))
    # Unlike write_deltalake, this leaves the handle at the version it was read at: a next commit
    # planned on it would conflict with this one's txns.
    table.update_incremental()


# Concurrent commits an append (or a claim) may land after: delta-rs checks each for a conflict
# (one of its application ids written since its snapshot) and otherwise commits on top. A topic's
# other owners commit every flush interval, and on a loaded object store a load takes seconds.
COMMIT_REBASES = 100


def _commit_properties(txns: Mapping[str, int] | None, metadata: Mapping[str, Any] | None) -> CommitProperties:
    return CommitProperties(
        app_transactions=[Transaction(app_id, version) for app_id, version in (txns or {}).items()],
        custom_metadata=dict(metadata) if metadata else None,
        max_commit_retries=COMMIT_REBASES,
    )


def set_properties(
    table: DeltaTable,
    properties: Mapping[str, str],
    *,
    txns: Mapping[str, int] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Set table properties, and in the same commit record each txn appId at its version. No
    retries: a concurrent commit fails this one, so the caller decides again on a fresh snapshot."""
    props = CommitProperties(
        app_transactions=[Transaction(app_id, version) for app_id, version in (txns or {}).items()],
        custom_metadata=dict(metadata) if metadata else None,
        max_commit_retries=0,
    )
    table.alter.set_table_properties(dict(properties), raise_if_not_exists=False, commit_properties=props)


CLEANUP_EVERY_VERSIONS = 100


def commit_hooks(table: DeltaTable) -> PostCommitHookProperties:
    """delta-rs's post-commit hooks for the next commit to `table`. Its expired-log cleanup lists
    the whole `_delta_log` after every commit (a stat per entry locally, a LIST request per 1,000
    entries on S3), and a topic table keeps 30 days of 250 ms commits there. Only a checkpoint lets
    the cleanup delete anything new, so it runs with a commit that writes one (delta-rs writes a
    checkpoint at version v when v + 1 is a multiple of the interval), and, where checkpoints come
    more often than every CLEANUP_EVERY_VERSIONS commits (topic tables: every 10), only with the
    first one at or past each such run."""
    config = table.metadata().configuration
    interval = int(config.get("delta.checkpointInterval") or DELTA_RS_CHECKPOINT_INTERVAL)
    ends = table.version() + 2  # the next version + 1, if no one commits first
    cleanup_every = interval * -(-CLEANUP_EVERY_VERSIONS // interval)  # a multiple of the interval, >= 100
    cleanup = ends % cleanup_every == 0 and (config.get("delta.enableExpiredLogCleanup") or "true").lower() == "true"
    return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=cleanup)


def overwrite(table: DeltaTable, data: pa.Table) -> None:
    write_deltalake(table, data, mode="overwrite")


def txn_version(table: DeltaTable, app_id: str) -> int | None:
    return table.transaction_version(app_id)


def committed_end(table: DeltaTable | None, partition: int) -> int:
    """A topic partition's committed end in this snapshot: the next offset the table will hold
    (0 without a table or a commit). The WAL's next offset is the assigned end (ingest_api)."""
    return 0 if table is None else table.transaction_version(partition_app_id(partition)) or 0


@dataclass(frozen=True)
class PartitionFiles:
    partition: int
    files: int
    rows: int
    size_bytes: int
    min_offset: int | None


def partition_files(table: DeltaTable) -> dict[int, PartitionFiles]:
    """Per-partition file count, rows, bytes and lowest offset, from the log alone (no data read)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return {}
    grouped = actions.group_by("partition.partition").aggregate(
        [("path", "count"), ("num_records", "sum"), ("size_bytes", "sum"), ("min.offset", "min")]
    )
    out: dict[int, PartitionFiles] = {}
    for row in grouped.to_pylist():
        p = int(row["partition.partition"])
        out[p] = PartitionFiles(p, row["path_count"], row["num_records_sum"] or 0, row["size_bytes_sum"] or 0,
                                row["min.offset_min"])
    return out


def row_count(table: DeltaTable) -> int | None:
    """The rows of a table's latest version from its log's file statistics (no data read); None
    when a file was written without them."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    if "num_records" not in actions.column_names or actions.column("num_records").null_count:
        return None
    return int(pc.sum(actions.column("num_records")).as_py())


def timestamp_literal(epoch_us: int) -> pc.Expression:
    """A literal comparable with the UTC microsecond `timestamp` columns."""
    return pc.scalar(pa.scalar(epoch_us, type=pa.timestamp("us", tz="UTC")))


def matching(equal: Mapping[str, Any], since: tuple[str, datetime | None] = ("", None)) -> pc.Expression:
    """A row filter: each column equal to its value (None: any value), and the `since` timestamp
    column at or after that moment (None: any time)."""
    flt = pc.scalar(True)
    for column, value in equal.items():
        if value is not None:
            flt = flt & (pc.field(column) == value)
    column, moment = since
    if moment is not None:
        flt = flt & (pc.field(column) >= timestamp_literal(int(moment.timestamp() * 1_000_000)))
    return flt


def read_offset_range(table: DeltaTable, partition: int, start: int, end: int,
                      columns: list[str] | None = None) -> pa.Table:
    """Rows of one topic partition with start <= offset < end. delta-rs prunes files by the
    partition value and offset statistics before any fragment is built, so the cost follows
    the files holding the range, not the files in the table (a tail read touches one or two)."""
    predicate = f'partition = {int(partition)} AND "offset" >= {int(start)} AND "offset" < {int(end)}'
    dataset: pads.Dataset = table.to_pyarrow_dataset(file_pruning_predicate=predicate)
    return dataset.to_table(filter=(pc.field("offset") >= start) & (pc.field("offset") < end), columns=columns)


_BATCH_ROWS = 65_536


def read_batches(table: DeltaTable, filter_expr: pc.Expression, columns: list[str], *,
                 files_at_once: int = 1) -> Iterator[pa.RecordBatch]:
    """`read_rows` a record batch at a time: a scan of a large table holds a batch or two, not the
    whole result (pyarrow's default read-ahead alone decodes up to 16 batches of 128k rows).
    `files_at_once`: for a scan the filter bounds to a few rows in many small files."""
    dataset: pads.Dataset = table.to_pyarrow_dataset()
    try:
        yield from dataset.to_batches(filter=filter_expr, columns=columns, batch_size=_BATCH_ROWS,
                                      batch_readahead=1, fragment_readahead=files_at_once)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # as in read_rows: small system tables only
        yield from dataset.to_table().filter(filter_expr).select(columns).to_batches()


def read_rows(table: DeltaTable, filter_expr: pc.Expression, columns: list[str] | None = None) -> pa.Table:
    """Read rows matching a filter; partition and file statistics prune what is opened."""
    dataset: pads.Dataset = table.to_pyarrow_dataset()
    try:
        return dataset.to_table(filter=filter_expr, columns=columns)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        # A file rewritten by delta-rs's own DML (an UPDATE of several groups' dead letters) gets
        # string_view statistics, which pyarrow cannot compare with a string filter when pruning
        # ("no kernel matching input types (string, string_view)"). Such tables are the small
        # system ones: read them unpruned and filter in memory.
        rows = dataset.to_table().filter(filter_expr)
        return rows.select(columns) if columns is not None else rows
