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

Delta's source takes no per-read `ignoreMissingFiles` (its scans get only the table's own options and
file-system ones), and Spark reads the setting from the session that runs a batch. So the stream is
made in a copy of the caller's session (`cloneSession`: its settings, views and functions as they
are) with the setting on, and the caller's session, with its other reads, keeps its own.

With a group, a listener on that copy commits the group's position to the consumer-offsets table
after each micro-batch: each partition's committed end at the last table version the query has read
whole (the `lakebroker.partition.<p>` transactions of that version). Spark's checkpoint holds the
query's exact position; the group mirrors it, for `/metrics`, the dashboard and the HTTP API. A
failed commit is logged and counted (`group_commits`), and tried again after the next micro-batch,
when the query idles, and when it stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
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

IGNORE_MISSING_FILES = "spark.sql.files.ignoreMissingFiles"


@dataclass(frozen=True)
class GroupCommits:
    """What a stream's group has committed from this session, as `group_commits` reads it."""

    group: str
    topic: str
    committed: dict[int, int]  # per partition, the position last committed (the next offset to read)
    pending: dict[int, int]  # a newer position the query has read, not committed yet: commits are failing
    commits: int  # commits that succeeded
    failures: int  # commits that failed, each logged
    last_error: str | None  # the newest failure, until a commit succeeds


@dataclass
class _Followed:
    """A group's stream of a topic, as the listener knows it."""

    offsets: OffsetsTable  # followed from one commit to the next
    topic: TopicConfig
    uri: str
    group: str
    floor: dict[int, int]  # where the stream started: a position never goes below it
    committed: dict[int, int] = field(default_factory=dict)
    pending: dict[int, int] = field(default_factory=dict)
    commits: int = 0
    failures: int = 0
    last_error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # the listener's thread writes, callers read

    def commit(self, position: Mapping[int, int]) -> None:
        """Commit the partitions of `position` that moved. A failure is logged and counted, and the
        position kept for the next try (a listener that raises is dropped by Spark)."""
        moved = {p: o for p, o in position.items() if self.committed.get(p) != o}
        if not moved:
            return
        try:
            self.offsets.commit(pull_group(self.group), self.topic.name, moved, OffsetReason.ACK)
        except Exception as exc:  # noqa: BLE001 - logged and counted by failed()
            self.failed(exc, moved)
            return
        with self.lock:
            self.committed.update(moved)
            self.pending = {}
            recovered, self.last_error = self.last_error is not None, None
            self.commits += 1
        if recovered:
            log.info("group %r committed its position on topic %r again (after %d failed commits)", self.group,
                     self.topic.name, self.failures)

    def failed(self, exc: Exception, position: Mapping[int, int] | None) -> None:
        with self.lock:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            if position is not None:
                self.pending = dict(position)
        log.error("group %r could not commit its position %s on topic %r (failed commit %d; the group stays "
                  "behind the query until a commit succeeds)", self.group,
                  "(not read)" if position is None else dict(position), self.topic.name, self.failures,
                  exc_info=exc)

    def status(self) -> GroupCommits:
        with self.lock:
            return GroupCommits(self.group, self.topic.name, dict(self.committed), dict(self.pending), self.commits,
                                self.failures, self.last_error)


def read_topic_stream(spark: SparkSession, topic: str, *, starting: Position = "latest", group: str | None = None,
                      settings: Settings | None = None) -> DataFrame:
    """A streaming DataFrame of `topic`'s new messages, with read_topic's columns.

    starting: where a query without a checkpoint begins: "latest" (default: messages committed
    after the query starts), "earliest", an aware datetime, a {partition: offset} map, or
    TableVersion(v) (messages committed after version v). With `group`, a group that has committed
    positions on this topic starts there instead, and the query's progress is committed as that
    group after each micro-batch; a failed commit is logged, counted by `group_commits(spark,
    topic)` and tried again. A query restarted from its checkpoint goes on from the checkpoint
    (Spark's exactly-once bookkeeping), skipping anything below the group's position.

    The DataFrame belongs to a copy of `spark` (`cloneSession`: its settings, temporary views and
    functions as they are now) with `spark.sql.files.ignoreMissingFiles` on, so that the stream
    reads past files a vacuum deleted after retention while `spark`'s other reads keep failing on a
    missing file. Queries started from it are listed in `df.sparkSession.streams`, not
    `spark.streams`."""

    layout = Layout.of(settings or Settings())
    config = TopicStore(layout).get(topic)
    uri = layout.topic_table(config)
    newest = delta.load(uri).version()
    offsets = OffsetsTable(layout)
    if group is not None and (committed := offsets.of_topic(pull_group(group), topic)):
        starting = committed
    session = _stream_session(spark)
    reader = session.readStream.format("delta").option("skipChangeCommits", "true")
    floor: dict[int, int] = {}
    if starting == "latest" or (isinstance(starting, TableVersion) and starting.version >= newest):
        reader = reader.option("startingVersion", "latest")
        floor = ends_at(uri, newest, config.partitions)
    elif isinstance(starting, TableVersion):
        if starting.version < 0:
            raise ValueError(f"a starting version is at least 0, not {starting.version}")
        reader = reader.option("startingVersion", str(starting.version + 1))
        floor = ends_at(uri, starting.version, config.partitions)
    rows = reader.load(storage.spark_uri(uri))
    if starting != "earliest" and not isinstance(starting, (str, TableVersion)):
        rows = rows.where(position_bound(starting, config, uri, newest, lower=True))
        if isinstance(starting, Mapping):
            floor = {int(p): int(o) for p, o in starting.items()}
    if group is not None:
        followed = _Followed(offsets, config, uri, group, floor)
        _register(spark, session, followed)
        _GroupCommits.attach(session, followed)
    return decoded(rows)


def group_commits(spark: SparkSession, topic: str) -> GroupCommits:
    """How the group of this session's newest `read_topic_stream(spark, topic, group=...)` has
    committed: its position as last committed, a newer one not committed yet (commits failing), and
    how many commits succeeded and failed. `spark` is the session given to read_topic_stream, or
    the stream's own (`df.sparkSession`). Raises ValueError if there is no such stream."""
    with _LOCK:
        followed = next((f for f in reversed(_STREAMS.get(id(spark), {}).values()) if f.topic.name == topic), None)
    if followed is None:
        raise ValueError(f"this session has no stream of topic {topic!r} with a group")
    return followed.status()


def _stream_session(spark: SparkSession) -> SparkSession:
    """A copy of `spark` for a stream, with missing files ignored: the setting stays out of `spark`."""
    clone = getattr(spark, "cloneSession", None)  # Spark Connect's; the classic API has it in the JVM only
    if clone is not None:
        session: SparkSession = clone()
    else:
        from pyspark.sql import SparkSession as Session

        session = Session(spark.sparkContext, spark._jsparkSession.cloneSession())
    session.conf.set(IGNORE_MISSING_FILES, "true")  # files a vacuum removed after retention
    return session


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


# By id() of the caller's session and of each stream's copy, then by the table's path, newest last.
_STREAMS: dict[int, dict[str, _Followed]] = {}
_LOCK = threading.Lock()


def _register(spark: SparkSession, session: SparkSession, followed: _Followed) -> None:
    """Remember the group's stream for `group_commits`; one group per topic and session."""
    path = _path(storage.spark_uri(followed.uri))
    with _LOCK:
        streams = _STREAMS.setdefault(id(spark), {})
        known = streams.pop(path, None)
        if known is not None and known.group != followed.group:
            streams[path] = known
            raise ValueError(f"this session streams topic {followed.topic.name!r} as group {known.group!r}; one "
                             "group per topic and session")
        streams[path] = followed
        _STREAMS[id(session)] = {path: followed}


class _GroupCommits:
    """A stream session's listener: after each micro-batch of the followed topic table, its group's position."""

    def __init__(self, followed: _Followed) -> None:
        self.followed = followed
        self.path = _path(storage.spark_uri(followed.uri))

    @classmethod
    def attach(cls, session: SparkSession, followed: _Followed) -> _GroupCommits:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        commits = cls(followed)

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None: ...

            def onQueryProgress(self, event: Any) -> None:
                commits.progress(event.progress.sources)

            # Spark posts an idle event at most every spark.sql.streaming.noDataProgressEventInterval (10 s)
            def onQueryIdle(self, event: Any) -> None:
                commits.retry()

            def onQueryTerminated(self, event: Any) -> None:
                commits.retry()

        session.streams.addListener(Listener())
        return commits

    def progress(self, sources: list[Any]) -> None:
        followed = self.followed
        for source in sources:
            description = str(source.description)
            if not description.startswith("DeltaSource[") or source.endOffset is None:
                continue
            if _path(description.removeprefix("DeltaSource[").removesuffix("]")) != self.path:
                continue
            try:
                position = group_position(str(source.endOffset), followed)
            except Exception as exc:  # noqa: BLE001 - the table's log unreadable: counted as a failed commit
                followed.failed(exc, None)
                continue
            if position is not None:
                followed.commit(position)

    def retry(self) -> None:
        """Commit what a failed commit left pending."""
        followed = self.followed
        with followed.lock:
            pending = dict(followed.pending)
        if pending:
            followed.commit(pending)


def _path(uri: str) -> str:
    """A table location as Spark prints it and as lakebroker names it, made comparable."""
    for prefix in ("file://", "file:"):
        if uri.startswith(prefix):
            return uri.removeprefix(prefix).rstrip("/")
    return uri.rstrip("/")
