"""Follows a topic table's Delta log commit by commit, for readers that tail a partition.

Asking delta-rs which files hold a partition's newest offsets costs time per file in the
table, and a delivery worker asks several times a second per partition
(docs/decisions/0018-readers-follow-delta-logs-commit-by-commit.md). A tail reader needs only
what changed: each new commit file lists the data files
it added and removed, with their offset statistics, and the txn versions that are the
partitions' log ends. This index reads just the new commit files, and rebuilds itself from
delta-rs when it cannot: on first use, or when the commits it needs were cleaned up behind a
newer checkpoint.

An idle poll is one failed open of the next commit file. Whether a newer checkpoint let the log
cleanup remove that file is asked (one more read: a GET on S3) only once every
CHECKPOINT_RECHECK_S: a commit is removed only once it is older than the table's log retention
(30 days unless set), so a tail that keeps polling cannot lose one between two of its looks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable

from lakebroker.tables import delta, storage
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.topics import Holes

CHECKPOINT_RECHECK_S = 30.0
FILE_SCHEMA = pa.schema([f for f in TOPIC_SCHEMA if f.name != "partition"])  # Hive-style: not in the files


@dataclass(frozen=True)
class DataFile:
    path: str
    partition: int
    min_offset: int | None  # None: no statistics, so the file can never be skipped
    max_offset: int | None


@dataclass(frozen=True)
class RangeRead:
    """One partition's rows in [start, end), planned from the index: the files that may hold them,
    or the delta-rs snapshot when the index cannot tell. Running it needs nothing of the index, so
    a tail shared by threads plans under its lock and reads and decodes outside it."""

    partition: int
    start: int
    end: int
    fs: pafs.FileSystem
    paths: tuple[str, ...]
    snapshot: DeltaTable | None  # set when the table has deletion vectors: read through delta-rs

    def run(self) -> pa.Table:
        """The rows, in TOPIC_SCHEMA's column order, not yet sorted. The offset filter reaches the
        Parquet reader, which skips every row group whose offset statistics miss the range before
        decoding it (writers keep row groups small: tables/parquet_files.py)."""
        if self.snapshot is not None:
            return delta.read_offset_range(self.snapshot, self.partition, self.start, self.end, TOPIC_SCHEMA.names)
        if not self.paths:
            return TOPIC_SCHEMA.empty_table()
        import pyarrow.dataset as pads  # here, not at import: it imports pandas (CLI start-up)

        rows = pads.dataset(list(self.paths), schema=FILE_SCHEMA, format="parquet", filesystem=self.fs).to_table(
            filter=(pc.field("offset") >= self.start) & (pc.field("offset") < self.end))
        column = pa.array([self.partition] * rows.num_rows, pa.int32())
        return rows.add_column(0, TOPIC_SCHEMA.field("partition"), column).select(TOPIC_SCHEMA.names)


class TopicLogTail:
    """The live data files and txn versions of one topic table, at `version`. Blocking I/O."""

    def __init__(self, uri: str, clock: Callable[[], float] = time.monotonic) -> None:
        # A local path (delta-rs may spell it as a file: URI) or an s3:// table, read through pyarrow.
        self.uri = unquote(urlsplit(uri).path) if uri.startswith("file:") else uri
        fs, self.root = storage.filesystem(self.uri)
        assert isinstance(fs, pafs.FileSystem)
        self.fs: pafs.FileSystem = fs
        self.version = -1
        self._files: dict[str, DataFile] = {}
        self._txns: dict[str, int] = {}
        self._snapshot: DeltaTable | None = None  # answers txns no commit since the rebuild touched
        self._unset: set[str] = set()  # txns the snapshot does not have
        self._exact = True  # False once deletion vectors appear: then every read goes through delta-rs
        self.holes = Holes()  # where the table's own properties make holes legitimate (tables.topics.Holes)
        self._clock = clock
        self._checkpoint_checked_at = -float("inf")  # when _fell_behind_a_checkpoint last ran

    def refresh(self) -> int:
        """Catch up with the newest commit; returns the version (-1: there is no table yet)."""
        if self.version < 0 or not self._exact:
            return self._rebuild()
        while True:
            try:
                commit = self._read(f"_delta_log/{self.version + 1:020d}.json")
            except FileNotFoundError:
                now = self._clock()
                if now - self._checkpoint_checked_at < CHECKPOINT_RECHECK_S:
                    return self.version  # no new commit: none can have been cleaned up since the last look
                self._checkpoint_checked_at = now
                return self._rebuild() if self._fell_behind_a_checkpoint() else self.version
            if not self._apply(commit):
                return self._rebuild()
            self.version += 1

    def txn(self, app_id: str) -> int | None:
        if app_id in self._txns:
            return self._txns[app_id]
        if self._snapshot is None:
            return None
        if app_id in self._unset:  # asking delta-rs again costs ms: a partition never written is polled
            return None
        found = self._snapshot.transaction_version(app_id)
        if found is None:
            self._unset.add(app_id)  # until a commit sets it (self._txns) or a rebuild
        else:
            self._txns[app_id] = found
        return found

    def known_txn(self, app_id: str) -> int | None:
        """`txn(app_id) or 0` when that takes no I/O; None when it would ask delta-rs."""
        if app_id in self._txns:
            return self._txns[app_id]
        if self._snapshot is None or app_id in self._unset:
            return 0
        return None

    def committed_end(self, partition: int) -> int:
        """The partition's committed end as of the last refresh (delta.committed_end)."""
        return self.txn(delta.partition_app_id(partition)) or 0

    def known_committed_end(self, partition: int) -> int | None:
        """`committed_end` when that takes no I/O; None when it would ask delta-rs."""
        return self.known_txn(delta.partition_app_id(partition))

    def files(self, partition: int, start: int = 0, end: int | None = None) -> list[DataFile]:
        """The partition's files that may hold offsets in [start, end)."""
        return [
            f for f in self._files.values()
            if f.partition == partition and (f.max_offset is None or f.max_offset >= start)
            and (end is None or f.min_offset is None or f.min_offset < end)
        ]

    def read(self, partition: int, start: int, end: int) -> pa.Table:
        """Rows with start <= offset < end, in TOPIC_SCHEMA's column order, not yet sorted."""
        return self.plan(partition, start, end).run()

    def plan(self, partition: int, start: int, end: int) -> RangeRead:
        """What `read` reads, taken from the index as it is now. The files go in offset order, so
        their rows come out in offset order (the index keeps no order: a rebuild lists the newest
        file first, and a rewrite's file joins after newer ones)."""
        files = sorted(self.files(partition, start, end), key=lambda f: -1 if f.min_offset is None else f.min_offset)
        paths = tuple(f.path for f in files)
        snapshot = self._snapshot if not self._exact else None
        return RangeRead(partition, start, end, self.fs, paths, snapshot)

    # -- internals --------------------------------------------------------------------------
    def _fell_behind_a_checkpoint(self) -> bool:
        """Log cleanup removes only commits older than a checkpoint: if the newest checkpoint is
        past us, the next commit file may be gone for good and the log can't be followed."""
        # On S3 pyarrow reads an object as a HEAD (its size) and a ranged GET: a `_last_checkpoint`
        # overwritten in between reads cut short or padded with NULs. Such a read is read again.
        for _ in range(3):
            try:
                last = orjson.loads(self._read("_delta_log/_last_checkpoint"))
            except FileNotFoundError:
                return False
            except orjson.JSONDecodeError:
                continue
            return bool(last.get("version", -1) > self.version)
        return False

    def _apply(self, commit: bytes) -> bool:
        """Apply one commit's actions; False if it holds something this index can't follow."""
        for line in commit.splitlines():
            if not line.strip():
                continue
            action = orjson.loads(line)
            if "add" in action:
                add = action["add"]
                if add.get("deletionVector"):
                    return False  # rows hidden inside a file: only a full Delta reader gets them right
                path = self._path(add["path"])
                self._files[path] = self._data_file(path, add)
            elif "remove" in action:
                self._files.pop(self._path(action["remove"]["path"]), None)
            elif "txn" in action:
                self._txns[action["txn"]["appId"]] = int(action["txn"]["version"])
            elif "metaData" in action:
                self.holes = Holes.of(action["metaData"].get("configuration") or {})
        return True

    def _rebuild(self) -> int:
        if not delta.exists(self.uri):
            return -1
        table = delta.load(self.uri)
        actions = pa.table(table.get_add_actions(flatten=True))
        columns = set(actions.column_names)
        vectors = [c for c in columns if c.startswith("deletionVector")]
        self._exact = all(actions[c].null_count == actions.num_rows for c in vectors)
        paths = actions["path"].to_pylist()
        parts = actions["partition.partition"].to_pylist() if actions.num_rows else []
        lows = actions["min.offset"].to_pylist() if "min.offset" in columns else [None] * len(paths)
        highs = actions["max.offset"].to_pylist() if "max.offset" in columns else [None] * len(paths)
        self._files = {}
        for path, part, low, high in zip(paths, parts, lows, highs, strict=True):
            full = self._path(path)
            self._files[full] = DataFile(full, int(part), low, high)
        self._txns = {}
        self._unset = set()
        self._snapshot = table
        self.holes = Holes.of(table.metadata().configuration)
        self.version = table.version()
        return self.version

    def _read(self, relative: str) -> bytes:
        with self.fs.open_input_stream(f"{self.root}/{relative}") as stream:
            return bytes(stream.read())

    def _path(self, relative: str) -> str:
        """A data file's path inside self.fs (the log holds paths relative to the table, or URIs)."""
        if "://" in relative:
            return unquote(relative.split("://", 1)[1])  # file:///a/b -> /a/b; s3://bucket/key -> bucket/key
        return f"{self.root}/{unquote(relative)}"

    @staticmethod
    def _data_file(path: str, add: dict[str, object]) -> DataFile:
        stats_json = add.get("stats")
        stats = orjson.loads(stats_json) if isinstance(stats_json, str) else {}
        low = stats.get("minValues", {}).get("offset")
        high = stats.get("maxValues", {}).get("offset")
        values = add["partitionValues"]
        assert isinstance(values, dict)
        return DataFile(path, int(values["partition"]), low, high)
