"""A topic read as a Spark Structured Streaming source, and a group's progress committed as it goes.

The stream is Delta's streaming source on the topic table, which reads each commit's added files
in commit order, so every micro-batch holds, per partition, offsets after the previous batch's.
It goes on across the broker's own maintenance:

- compaction rewrites files without changing data (`dataChange=false`): the source skips them,
  so nothing is read twice;
- retention and key compaction remove rows (a file dropped whole, or rewritten without them): with
  `skipChangeCommits` the source skips those commits instead of failing on them, and the rows they
  drop that the stream had not read yet are not read (a stream that falls behind retention loses what
  retention removed and reads on from what is left, as a Kafka consumer does with
  `auto.offset.reset=earliest`; `spark.sql.files.ignoreMissingFiles` lets it read past data files a
  vacuum deleted under it).

With a group, a listener on the session commits the group's position to the consumer-offsets table
after each micro-batch: each partition's committed end at the last table version the query has read
whole (the `lakebroker.partition.<p>` transactions of that version). Spark's checkpoint holds the
query's exact position; the group mirrors it, for `/metrics`, the dashboard and the HTTP API.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from lakebroker.spark_pipeline.topic_reads import Position, TableVersion, decoded, ends_at, position_bound
from lakebroker.tables import delta, storage
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import OffsetReason, OffsetsTable, pull_group
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, TopicStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass
class _Followed:
    """A group's stream of a topic, as the listener knows it."""

    offsets: OffsetsTable  # followed from one commit to the next
    topic: TopicConfig
    uri: str
    group: str
    floor: dict[int, int]  # where the stream started: a position never goes below it
    committed: dict[int, int]


def read_topic_stream(spark: SparkSession, topic: str, *, starting: Position = "latest", group: str | None = None,
                      settings: Settings | None = None) -> DataFrame:
    """A streaming DataFrame of `topic`'s new messages, with read_topic's columns.

    starting: where a query without a checkpoint begins: "latest" (default: messages committed
    after the query starts), "earliest", an aware datetime, a {partition: offset} map, or
    TableVersion(v) (messages committed after version v). With `group`, a group that has committed
    positions on this topic starts there instead, and the query's progress is committed as that
    group after each micro-batch. A query restarted from its checkpoint goes on from the checkpoint
    (Spark's exactly-once bookkeeping), skipping anything below the group's position."""

    layout = Layout.of(settings or Settings())
    config = TopicStore(layout).get(topic)
    uri = layout.topic_table(config)
    newest = delta.load(uri).version()
    offsets = OffsetsTable(layout)
    if group is not None and (committed := offsets.of_topic(pull_group(group), topic)):
        starting = committed
    reader = spark.readStream.format("delta").option("skipChangeCommits", "true")
    floor: dict[int, int] = {}
    if starting == "latest" or (isinstance(starting, TableVersion) and starting.version >= newest):
        reader = reader.option("startingVersion", "latest")
        floor = ends_at(uri, newest, config.partitions)
    elif isinstance(starting, TableVersion):
        if starting.version < 0:
            raise ValueError(f"a starting version is at least 0, not {starting.version}")
        reader = reader.option("startingVersion", str(starting.version + 1))
        floor = ends_at(uri, starting.version, config.partitions)
    spark.conf.set("spark.sql.files.ignoreMissingFiles", "true")  # files a vacuum removed after retention
    rows = reader.load(storage.spark_uri(uri))
    if starting != "earliest" and not isinstance(starting, (str, TableVersion)):
        rows = rows.where(position_bound(starting, config, uri, newest, lower=True))
        if isinstance(starting, Mapping):
            floor = {int(p): int(o) for p, o in starting.items()}
    if group is not None:
        _listener(spark).follow(_Followed(offsets, config, uri, group, floor, {}))
    return decoded(rows)


def group_position(end_offset: str, followed: _Followed) -> dict[int, int] | None:
    """The group's position after a micro-batch that ended at Delta's `end_offset`: each partition's
    committed end at the last version read whole (None while the first snapshot is half read)."""
    offset = orjson.loads(end_offset)
    if offset.get("isStartingVersion"):
        return None
    version = int(offset["reservoirVersion"]) - 1  # every version before it is read whole
    if version < 0:
        return None
    ends = ends_at(followed.uri, version, followed.topic.partitions)
    return {p: max(end, followed.floor.get(p, 0)) for p, end in ends.items()}


_LISTENERS: dict[int, _GroupCommits] = {}
_LOCK = threading.Lock()


def _listener(spark: SparkSession) -> _GroupCommits:
    with _LOCK:
        key = id(spark)
        if key not in _LISTENERS:
            _LISTENERS[key] = _GroupCommits.attach(spark)
        return _LISTENERS[key]


class _GroupCommits:
    """The session's listener: after each micro-batch of a followed topic table, its group's position."""

    def __init__(self) -> None:
        self._followed: dict[str, _Followed] = {}  # by the table's path as Spark names it
        self._lock = threading.Lock()

    @classmethod
    def attach(cls, spark: SparkSession) -> _GroupCommits:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        commits = cls()

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None: ...

            def onQueryProgress(self, event: Any) -> None:
                commits.progress(event.progress.sources)

            def onQueryIdle(self, event: Any) -> None: ...

            def onQueryTerminated(self, event: Any) -> None: ...

        spark.streams.addListener(Listener())
        return commits

    def follow(self, followed: _Followed) -> None:
        path = _path(storage.spark_uri(followed.uri))
        with self._lock:
            known = self._followed.get(path)
            if known is not None and known.group != followed.group:
                raise ValueError(f"this session streams topic {followed.topic.name!r} as group {known.group!r}; one "
                                 f"group per topic and session (its queries' progress could not be told apart)")
            self._followed[path] = followed

    def progress(self, sources: list[Any]) -> None:
        for source in sources:
            description = str(source.description)
            if not description.startswith("DeltaSource[") or source.endOffset is None:
                continue
            with self._lock:
                followed = self._followed.get(_path(description.removeprefix("DeltaSource[").removesuffix("]")))
            if followed is None:
                continue
            try:
                position = group_position(str(source.endOffset), followed)
                moved = {p: o for p, o in (position or {}).items() if followed.committed.get(p) != o}
                if moved:
                    followed.offsets.commit(pull_group(followed.group), followed.topic.name, moved, OffsetReason.ACK)
                    followed.committed.update(moved)
            except Exception:  # a listener that raises is dropped by Spark: log, and commit at the next batch
                log.exception("committing group %r's position on %r failed", followed.group, followed.topic.name)


def _path(uri: str) -> str:
    """A table location as Spark prints it and as lakebroker names it, made comparable."""
    for prefix in ("file://", "file:"):
        if uri.startswith(prefix):
            return uri.removeprefix(prefix).rstrip("/")
    return uri.rstrip("/")
