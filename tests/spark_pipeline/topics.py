"""Real topic tables for job tests: created through TopicStore, appended as the flusher appends
(one commit per batch, carrying each partition's log-end offset as a txn)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from lakebroker.tables import delta, storage
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, TopicStore, new_topic
from tests.waiting import eventually

NOW_US = lambda: int(time.time() * 1_000_000)  # noqa: E731


def settings_for(data: Path, **overrides: Any) -> Settings:
    return Settings(**{"data_dir": data, "spark_master": "local[2]", "vacuum_retention_hours": 0.0, **overrides})


def create_topic(settings: Settings, name: str, partitions: int = 2, **config: Any) -> TopicConfig:
    return TopicStore(Layout.of(settings)).create(new_topic(name, partitions, **config))


def table(settings: Settings, topic: str) -> DeltaTable:
    layout = Layout.of(settings)
    return delta.load(layout.topic_table(TopicStore(layout).get(topic)))


def log_ends(settings: Settings, topic: str, partitions: int) -> dict[int, int | None]:
    t = table(settings, topic)
    return {p: t.transaction_version(delta.partition_app_id(p)) for p in range(partitions)}


def produce(settings: Settings, topic: str, partition: int, n: int, *, ts_us: int | Sequence[int] | None = None,
            keys: Sequence[str | None] | None = None, values: Sequence[bytes | None] | None = None,
            table_: DeltaTable | None = None) -> tuple[int, int]:
    """Append n rows to one partition at its log end, as one flusher commit; returns [start, end)."""
    t = table_ or table(settings, topic)
    t.update_incremental()
    start = t.transaction_version(delta.partition_app_id(partition)) or 0
    stamps = [ts_us] * n if isinstance(ts_us, int) else list(ts_us) if ts_us is not None else [NOW_US()] * n
    rows = pa.table({
        "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(range(start, start + n), pa.int64()),
        "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC")),
        "key": pa.array(list(keys) if keys is not None else [f"k{(start + i) % 7}" for i in range(n)], pa.string()),
        "value": pa.array(list(values) if values is not None else [f"v{start + i}".encode() for i in range(n)],
                          pa.binary()),
        "format": pa.array(["text"] * n, pa.string()),
        "headers": pa.array([None] * n, pa.map_(pa.string(), pa.string())),
        "message_id": pa.array([None] * n, pa.string()),
        "producer_id": pa.array([None] * n, pa.string()),
        "sequence": pa.array([None] * n, pa.int64()),
    }, schema=TOPIC_SCHEMA)
    delta.append_partitions(t, {partition: rows}, txns={delta.partition_app_id(partition): start + n},
                            metadata={"lakebroker.operation": "flush"})
    return start, start + n


def rows(settings: Settings, topic: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = table(settings, topic).to_pyarrow_table(columns=columns).to_pylist()
    return out


def offsets_by_partition(settings: Settings, topic: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in rows(settings, topic, ["partition", "offset"]):
        out.setdefault(r["partition"], []).append(r["offset"])
    return {p: sorted(v) for p, v in out.items()}


def commit_infos(uri: str) -> list[tuple[int, dict[str, Any]]]:
    """(version, commitInfo) of every JSON commit still in the log (a local path or s3://)."""
    fs, root = storage.filesystem(uri)
    assert isinstance(fs, pafs.FileSystem)
    out = []
    for f in sorted(fs.get_file_info(pafs.FileSelector(f"{root}/_delta_log")), key=lambda i: i.base_name):
        if re.fullmatch(r"\d{20}\.json", f.base_name):
            with fs.open_input_stream(f.path) as stream:
                text = stream.read().decode()
            for line in text.splitlines():
                action = json.loads(line)
                if "commitInfo" in action:
                    out.append((int(f.base_name[:20]), action["commitInfo"]))
    return out


def file_count(settings: Settings, topic: str, partition: int | None = None) -> int:
    t = table(settings, topic)
    t.update_incremental()
    actions = pa.table(t.get_add_actions(flatten=True))
    if partition is None:
        return actions.num_rows
    return sum(1 for p in actions.column("partition.partition").to_pylist() if p == partition)


class ConcurrentFlusher:
    """Appends to a topic from a thread as the flusher does (`rows` per commit, partitions in turn),
    bounded in count and time, while a job runs: `with ConcurrentFlusher(...) as f: job()`.
    Like the flusher, a commit Delta refuses is made again (`refused` counts them).
    `appended` holds (partition, start, end, monotonic time) per commit; `errors` what it raised."""

    def __init__(self, settings: Settings, topic: str, rows: int, partitions: int = 2) -> None:
        self.settings, self.topic, self.rows, self.partitions = settings, topic, rows, partitions
        self.appended: list[tuple[int, int, int, float]] = []
        self.errors: list[BaseException] = []
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, name="delta-rs-flusher")

    def _write(self) -> None:
        t = table(self.settings, self.topic)
        deadline = time.monotonic() + 180
        try:
            for i in range(400):
                if self._stop.is_set() or time.monotonic() > deadline:
                    break
                p = i % self.partitions
                for attempt in range(5):
                    try:
                        start, end = produce(self.settings, self.topic, p, self.rows, table_=t)
                        break
                    except CommitFailedError:
                        if attempt == 4:
                            raise
                        self.refused += 1  # nothing was committed: the same rows go again, at the same offsets
                self.appended.append((p, start, end, time.monotonic()))
                # A few commits a second keep landing inside the job's read-to-commit window. At 20 a
                # second, 300 of them piled up beside one S3 compaction, and the replication and
                # verify after it copied and checked every one.
                time.sleep(0.25)
        except Exception as exc:  # noqa: BLE001 - surfaced by the test's assertion
            self.errors.append(exc)

    def wait_for_commits(self, n: int, timeout: float = 120) -> None:
        eventually(lambda: len(self.appended) >= n or not self._thread.is_alive(), timeout,
                   what=f"{n} concurrent commits")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> ConcurrentFlusher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
