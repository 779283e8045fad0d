"""Replication: an incremental, resumable, idempotent copy of every table to a second location.

Open-source Delta's SHALLOW CLONE only points at the primary's files, so it is no replica. Instead,
per table, a Delta *streaming read* of the primary with the AvailableNow trigger and a checkpoint
copies what was appended since the last run, then stops:

* the checkpoint lives with the replica (`<to>/_replication/checkpoints/...`), one per table and
  topic id, so each run resumes where the last one stopped, and a topic re-created under the same
  name starts a fresh copy (its old replica table is dropped);
* `skipChangeCommits` makes the stream ignore the primary's retention, key-compaction and
  offsets-compaction commits (they only remove or rewrite rows already copied); compaction's
  `dataChange=false` commits are ignored by any Delta stream;
* each micro-batch is committed to the replica with a txn action (appId
  `lakebroker.replicate.<query id>`, version = batch id) in the same commit as its rows, and a
  batch whose version is already recorded is skipped, so a batch replayed after a crash (committed
  to the replica, not yet to the checkpoint) is never applied twice;
* topic rows are also filtered against the replica's own per-partition log end (which is carried
  as the same `lakebroker.partition.{p}` txn the flusher writes, so a replica can be promoted):
  even a lost checkpoint, which restarts the stream from scratch, cannot duplicate a row.

The replica's retention follows the primary's: after copying, each replica partition is advanced
to the primary's log-start offset (whole files, plus a trim of the one straddling file), the
primary's hole properties (`lakebroker.keyCompacted`, `lakebroker.lostOffsets`) are set on the
replica and its log ends moved past offsets lost to WAL damage, rows that
key compaction removed on the primary are removed on the replica (compact topics), the replica's
offsets table is compacted like the primary's, and replica tables are VACUUMed.

A table whose primary is still at the version the last complete run started from, and whose
replica is still at the version that run left, is skipped: no stream, no trim, no join (only its
VACUUM runs). Those two versions are kept beside the stream checkpoint (`CAUGHT_UP`).

The small, updated-in-place system tables (`topics`, `subscriptions`, `tokens`, `dead_letters`,
`retention_skips`, `lost_offsets`) are copied whole whenever their version changed (txnAppId/txnVersion = source
version, so a replay is skipped). Tokens go with them so that a promoted replica accepts the
clients' tokens (the table holds only their SHA-256 hashes, while subscriptions carry their
signing secrets in the clear); a token revoked after the last run still works on the replica.
`_system/job_runs` and the delivery leases are not replicated.

Limits: the replica lags by up to one run; a replica further behind than the primary's
`vacuum_retention_hours` (or `delta.logRetentionDuration`) cannot resume, since the files or log
entries it still needs are gone (verify-replica reports the lag; re-create the replica then).
A schema change on the primary stops the stream until the replica's table is re-created.
"""

from __future__ import annotations

import fnmatch
import json
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from lakebroker.spark_pipeline.delta_txn import DeltaTxn, app_version, jvm_of, maintain_log, table_exists, with_retries
from lakebroker.spark_pipeline.jobs.common import (
    CONFLICT_ATTEMPTS,
    entry_main,
    job_tags,
    parser,
    remove_rows,
    select_topics,
    settings_from,
    vacuum,
)
from lakebroker.spark_pipeline.jobs.offsets_compaction import compact_offsets
from lakebroker.spark_pipeline.jobs.retention import follow_log_starts
from lakebroker.spark_pipeline.results import Progress, Run
from lakebroker.tables import delta, storage
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.job_runs import JobName, JobResult, Outcome, TableResult
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_start import log_starts
from lakebroker.tables.logs import exit_without_teardown
from lakebroker.tables.schemas import KEY_COMPACTED_PROPERTY, LOST_OFFSETS_PROPERTY
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import CleanupPolicy, Holes, TopicConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REPLICATION_APP_PREFIX = "lakebroker.replicate."
SNAPSHOT_APP_ID = "lakebroker.replicate.snapshot"
SNAPSHOT_TABLES = ("topics", "subscriptions", "tokens", "dead_letters", "retention_skips", "lost_offsets")
STREAM_TIMEOUT_S = 6 * 3600  # one table's catch-up; bounded so a stuck stream cannot hang the scheduler
MAX_FILES_PER_BATCH = 1000


@dataclass(frozen=True)
class Replica:
    """Where each table of a data dir lives in the replica (the same layout as a data dir, so
    `lakebroker --data-dir <replica>` can serve it after a failover)."""

    root: str

    def topic_table(self, topic: TopicConfig) -> str:
        return f"{self.root}/{topic.location}"

    def system_table(self, name: str) -> str:
        return f"{self.root}/_system/{name}"

    def checkpoint(self, kind: str, name: str, ident: str) -> str:
        return f"{self.root}/_replication/checkpoints/{kind}/{name}-{ident}"

    @property
    def is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file:")

    @property
    def listable(self) -> bool:
        """A local path or S3: this process can list and delete in it (tables/storage.py)."""
        return self.is_local or storage.is_s3(self.root)


def resolve_replica(uri: str | None, data_dir: Path, tables_uri: str | None = None) -> Replica:
    """Validate `--to`: a local path or file: URI outside the data dir, or an object-store URI
    (s3:// becomes s3a://, as Spark reaches it) outside the table root `tables_uri`."""
    if not uri or not uri.strip():
        raise InvalidRequest("replication needs a target: --to URI (or the replication_uri setting)")
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise InvalidRequest(f"bad replica URI {uri!r}: a file: URI must be file:///absolute/path")
        path = Path(parsed.path if parsed.scheme == "file" else uri).expanduser().resolve()
        data = data_dir.resolve()
        if path == data or data in path.parents or path in data.parents:
            raise InvalidRequest(f"bad replica URI {uri!r}: the replica must be outside the data dir {data}")
        return Replica(str(path))
    if len(parsed.scheme) == 1:  # a Windows drive letter is no scheme we support
        raise InvalidRequest(f"bad replica URI {uri!r}")
    if not parsed.netloc:
        raise InvalidRequest(f"bad replica URI {uri!r}: expected scheme://bucket/path")
    if not storage.is_s3(uri):
        return Replica(uri.rstrip("/"))
    root = storage.spark_uri(storage.parse_root(uri))
    if tables_uri and storage.is_s3(tables_uri):
        primary = storage.spark_uri(tables_uri)
        if root == primary or root.startswith(primary + "/") or primary.startswith(root + "/"):
            raise InvalidRequest(f"bad replica URI {uri!r}: the replica must be outside the table root {tables_uri}")
    return Replica(root)


def check_filesystem(spark: SparkSession, replica: Replica) -> None:
    """Refuse a URI whose scheme has no Hadoop filesystem on this Spark (one line, no traceback)."""
    if replica.is_local:
        return
    jvm = jvm_of(spark)
    try:
        jvm.org.apache.hadoop.fs.Path(replica.root).getFileSystem(spark._jsc.hadoopConfiguration())
    except Exception as exc:  # noqa: BLE001 - py4j wraps Hadoop's error; reported as bad input
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidRequest(f"bad replica URI {replica.root!r}: {first[:300]}") from None


def run(spark: SparkSession, settings: Settings, topic: str | None = None, *, to: str | None = None,
        trigger: str = "library", progress: Progress | None = None) -> JobResult:
    """Replicate one topic, or every topic and the system tables, to `to` (default: replication_uri)."""
    layout = Layout.of(settings, for_spark=True)
    replica = resolve_replica(to or settings.replication_uri, settings.data_dir, settings.tables_uri)
    topics = select_topics(layout, topic)
    check_filesystem(spark, replica)
    job = Run(JobName.REPLICATION, trigger, progress=progress, rows=lambda t: t.details.get("rows_copied"))
    job.expect(len(topics) + (1 + len(SNAPSHOT_TABLES) if topic is None else 0))
    run_id = job.result.run_id
    for t in topics:
        job.table(t.name, t.name, partial(replicate_topic, spark, layout, replica, t, settings, run_id=run_id))
    if topic is None:
        job.table("_system/consumer_offsets", None, partial(replicate_offsets, spark, layout, replica, settings,
                                                            run_id=run_id))
        for name in SNAPSHOT_TABLES:
            source = layout.system_table(name)
            job.table(f"_system/{name}", None, partial(copy_snapshot, spark, source, replica.system_table(name)))
        if replica.listable and topics:  # never mirror "no topics" (an unreadable topic list) as a wipe
            _drop_deleted_topics(replica, topics)
    return job.finish()


# -- topics ---------------------------------------------------------------------------------------
def replicate_topic(spark: SparkSession, layout: Layout, replica: Replica, topic: TopicConfig, settings: Settings,
                    result: TableResult, *, run_id: str) -> None:
    source = layout.topic_table(topic)
    target = replica.topic_table(topic)
    if not table_exists(spark, source):
        result.outcome = Outcome.SKIPPED
        result.details["reason"] = "no table yet"
        return
    _ensure_replica_table(spark, source, target, replica, identity={"lakebroker.topicId": topic.topic_id},
                          checkpoints=replica.checkpoint("topics", topic.name, "*"))
    result.files_before, result.bytes_before = _file_totals(spark, target)
    checkpoint = replica.checkpoint("topics", topic.name, topic.topic_id)
    source_version = _version(source)
    if _caught_up(checkpoint, source_version, target):
        result.details.update(batches=0, batches_skipped=0, rows_copied=0, checkpoint=checkpoint, caught_up=True)
    else:
        result.details.update(stream_copy(spark, source, target, checkpoint, topic=topic, run_id=run_id))
        result.details.update(follow_holes(spark, source, target, topic.partitions, run_id=run_id))
        result.details["log_starts"] = starts = primary_log_starts(source, topic.partitions)
        applied = follow_log_starts(spark, target, topic.partitions, starts, run_id=run_id)
        removed = applied.rows_removed
        if topic.cleanup_policy is CleanupPolicy.COMPACT:
            removed += mirror_removed_rows(spark, source, target, run_id=run_id,
                                           target_bytes=settings.compaction_target_file_bytes)
        result.rows_removed = removed
    vacuum(spark, target, settings.vacuum_retention_hours)
    if replica.listable:
        maintain_log(target)
    result.files_after, result.bytes_after = _file_totals(spark, target)
    result.details["replica"] = target
    _record_caught_up(checkpoint, source_version, target)


# A run that finds the primary where the last complete run left it, and the replica too, has
# nothing to copy, trim or remove: it skips the stream (a streaming query and its checkpoint
# writes) and the Spark joins. The last complete run's versions sit beside its stream checkpoint,
# so a re-created replica table (whose checkpoints are dropped with it) starts over.
CAUGHT_UP = "lakebroker-caught-up.json"


def _version(uri: str) -> int | None:
    """A table's version, read by delta-rs; None where delta-rs cannot read it (no skipping there)."""
    return int(delta.load(uri).version()) if storage.delta_rs_reads(uri) else None


def _caught_up_mark(checkpoint: str, source_version: int | None, target: str) -> tuple[str, bytes] | None:
    """Where the versions of the last complete run are kept, and what they would read now; None
    where delta-rs cannot read one side (no skipping there)."""
    if source_version is None or not storage.delta_rs_reads(checkpoint):
        return None
    versions = {"source_version": source_version, "replica_version": _version(target)}
    return storage.join(checkpoint, CAUGHT_UP), json.dumps(versions).encode()


def _caught_up(checkpoint: str, source_version: int | None, target: str) -> bool:
    mark = _caught_up_mark(checkpoint, source_version, target)
    return mark is not None and storage.read_small(mark[0]) == mark[1]


def _record_caught_up(checkpoint: str, source_version: int | None, target: str) -> None:
    """After a complete run: the primary's version read before its stream started (so whatever
    the stream copied covers it), and the replica's as the run left it. Written only when it
    changed: an idle run, the usual scheduled one, reads it and writes nothing."""
    mark = _caught_up_mark(checkpoint, source_version, target)
    if mark is not None and storage.read_small(mark[0]) != mark[1]:
        storage.write_small(*mark)


def _file_totals(spark: SparkSession, uri: str) -> tuple[int, int]:
    """Files and bytes of a topic table's latest version (partitioned by partition), for the run's report."""
    if storage.delta_rs_reads(uri):  # from the log: no Spark query
        partitions = delta.partition_files(delta.load(uri)).values()
        return sum(p.files for p in partitions), sum(p.size_bytes for p in partitions)
    files = DeltaTxn(spark, uri).files()
    return len(files), sum(f.size for f in files)


# The properties that tell a reader which holes below a partition's log end are legitimate
# (tables/topics.py Holes). A replica without them would read a key-compacted partition, or one
# past offsets lost to WAL damage, as a damaged table.
HOLE_PROPERTIES = (KEY_COMPACTED_PROPERTY, LOST_OFFSETS_PROPERTY)


def follow_holes(spark: SparkSession, source: str, target: str, partitions: int, *, run_id: str) -> dict[str, Any]:
    """Give the replica the primary's hole properties, and move each replica partition's log end
    past a lost range it has reached, as the primary's `wal skip` did (that commit has no rows, so
    the stream does not carry it). A range the replica has not reached yet is passed by a later run."""
    wanted = {k: v for k, v in delta.load(source).metadata().configuration.items() if k in HOLE_PROPERTIES}

    def once() -> dict[str, Any]:
        txn = DeltaTxn(spark, target)
        changed = {k: v for k, v in wanted.items() if txn.configuration.get(k) != v}
        holes = Holes.of({**txn.configuration, **changed})
        ends: dict[str, int] = {}
        for p in range(partitions):
            end = txn.app_version(delta.partition_app_id(p)) or 0
            if holes.past_lost(p, end) != end:
                ends[delta.partition_app_id(p)] = holes.past_lost(p, end)
        if changed or ends:
            txn.set_properties(changed)
            txn.commit([], txn.set_properties_op(changed), tags=job_tags(JobName.REPLICATION, run_id),
                       app_versions=ends)
        return {"properties_followed": sorted(changed), "log_ends_moved_past_lost": len(ends)}

    return with_retries(f"hole properties of {target}", CONFLICT_ATTEMPTS, once)


def primary_log_starts(source: str, partitions: int) -> dict[int, int]:
    """Each primary partition's lowest offset still present (its log end if retention emptied it)."""
    return log_starts(delta.load(source), partitions)


def stream_copy(spark: SparkSession, source: str, target: str, checkpoint: str, *, topic: TopicConfig | None,
                run_id: str) -> dict[str, Any]:
    """Copy what the primary appended since the checkpoint, batch by batch, then stop."""
    from pyspark.sql import functions as F

    started = threading.Event()
    query_id: dict[str, str] = {}
    stats = {"batches": 0, "batches_skipped": 0, "rows_copied": 0}

    def write_batch(frame: DataFrame, batch_id: int) -> None:
        started.wait(120)
        app_id = REPLICATION_APP_PREFIX + query_id["id"]

        def once() -> None:
            txn = DeltaTxn(spark, target)
            done = txn.app_version(app_id)
            if done is not None and done >= batch_id:
                stats["batches_skipped"] += 1  # replayed after a crash: already in the replica
                return
            data = frame
            ends: dict[int, int] = {}
            if topic is not None:
                ends = {p: txn.app_version(delta.partition_app_id(p)) or 0 for p in range(topic.partitions)}
                floor = F.create_map(*[F.lit(x) for p, end in ends.items() for x in (p, end)])
                data = frame.where(F.col("offset") >= F.coalesce(F.element_at(floor, F.col("partition")), F.lit(0)))
            adds = txn.write(data, data_change=True)
            versions = {app_id: batch_id}
            for f in txn.added_files(adds):
                if topic is not None and f.partition is not None and f.max_offset is not None:
                    versions[delta.partition_app_id(f.partition)] = max(
                        versions.get(delta.partition_app_id(f.partition), 0), ends.get(f.partition, 0),
                        f.max_offset + 1)
            rows = sum(f.rows or 0 for f in txn.added_files(adds))
            txn.commit(adds, txn.append_op(), tags=job_tags(JobName.REPLICATION, run_id), app_versions=versions,
                       metrics={"numOutputRows": rows})
            stats["batches"] += 1
            stats["rows_copied"] += rows

        with_retries(f"replication batch {batch_id} of {source}", CONFLICT_ATTEMPTS, once)

    stream = (spark.readStream.format("delta").option("skipChangeCommits", "true")
              .option("maxFilesPerTrigger", MAX_FILES_PER_BATCH).load(source))
    query = (stream.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query_id["id"] = str(query.id)
    started.set()
    try:
        finished = query.awaitTermination(STREAM_TIMEOUT_S)
    finally:
        if query.isActive:
            query.stop()
    if not finished:
        raise TimeoutError(f"replication of {source} did not catch up within {STREAM_TIMEOUT_S}s")
    if query.exception() is not None:
        raise RuntimeError(f"replication stream of {source} failed: {query.exception()}")
    return {**stats, "checkpoint": checkpoint}


def mirror_removed_rows(spark: SparkSession, source: str, target: str, *, target_bytes: int, run_id: str) -> int:
    """Remove from the replica the rows key compaction removed on the primary (below the
    primary's newest offset), rewriting only the affected replica files."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    def once() -> int:
        txn = DeltaTxn(spark, target)
        listed = txn.files()
        if not listed:
            return 0
        replica_rows = txn.read(listed).select("partition", "offset")
        primary_rows = spark.read.format("delta").load(source).select("partition", "offset")
        primary_end = primary_rows.groupBy("partition").agg(F.max("offset").alias("newest"))
        gone = (replica_rows.join(primary_end, "partition").where(F.col("offset") <= F.col("newest"))
                .select("partition", "offset").join(primary_rows, ["partition", "offset"], "left_anti")
                .persist(StorageLevel.MEMORY_AND_DISK))
        try:
            removal = remove_rows(txn, listed, gone, target_bytes=target_bytes)
            if removal.rows_removed:
                txn.commit(removal.actions, txn.delete_op(["offset >= 0"]), tags=job_tags(JobName.REPLICATION, run_id),
                           metrics={"numDeletedRows": removal.rows_removed, "numCopiedRows": removal.rows_copied})
            return removal.rows_removed
        finally:
            gone.unpersist()

    return with_retries(f"replica key compaction of {target}", CONFLICT_ATTEMPTS, once)


# -- system tables ------------------------------------------------------------------------------------
def replicate_offsets(spark: SparkSession, layout: Layout, replica: Replica, settings: Settings,
                      result: TableResult, *, run_id: str) -> None:
    source = layout.offsets_table
    target = replica.system_table("consumer_offsets")
    if not table_exists(spark, source):
        result.outcome = Outcome.SKIPPED
        result.details["reason"] = "no offsets committed yet"
        return
    table_id = str(delta.load(source).metadata().id)
    _ensure_replica_table(spark, source, target, replica, identity={"lakebroker.sourceTableId": table_id},
                          checkpoints=replica.checkpoint("system", "consumer_offsets", "*"))
    checkpoint = replica.checkpoint("system", "consumer_offsets", table_id)
    source_version = _version(source)
    if _caught_up(checkpoint, source_version, target):
        result.details.update(batches=0, batches_skipped=0, rows_copied=0, checkpoint=checkpoint, caught_up=True)
        vacuum(spark, target, settings.vacuum_retention_hours)  # as for a caught-up topic: files age
        _record_caught_up(checkpoint, source_version, target)
        return
    result.details.update(stream_copy(spark, source, target, checkpoint, topic=None, run_id=run_id))
    compacted = TableResult(target=result.target, topic=None)
    compact_offsets(spark, target, compacted, run_id=run_id, vacuum_hours=settings.vacuum_retention_hours)
    result.rows_removed = compacted.rows_removed
    result.files_after, result.bytes_after = compacted.files_after, compacted.bytes_after
    _record_caught_up(checkpoint, source_version, target)


def copy_snapshot(spark: SparkSession, source: str, target: str, result: TableResult) -> None:
    """Copy a small system table whole when its version changed (a replay of the same version is
    skipped by Delta's txnAppId/txnVersion)."""
    if not table_exists(spark, source):
        result.outcome = Outcome.SKIPPED
        result.details["reason"] = "no table yet"
        return
    version = int(delta.load(source).version())
    if table_exists(spark, target) and app_version(spark, target, SNAPSHOT_APP_ID) == version:
        result.details.update({"source_version": version, "copied": False})
        return
    frame = spark.read.format("delta").option("versionAsOf", version).load(source)
    (frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .option("txnAppId", SNAPSHOT_APP_ID).option("txnVersion", version).save(target))
    result.details.update({"source_version": version, "copied": True})


# -- replica tables -----------------------------------------------------------------------------------
def _ensure_replica_table(spark: SparkSession, source: str, target: str, replica: Replica,
                          identity: dict[str, str], checkpoints: str) -> None:
    """Create the replica table like the primary's (schema, partitioning, properties); drop it
    (and its stream checkpoints) first if it replicates a different incarnation of the source."""
    from delta.tables import DeltaTable as SparkDeltaTable

    if table_exists(spark, target):
        current = DeltaTxn(spark, target).configuration
        if all(current.get(k) == v for k, v in identity.items()):
            return
        if not replica.listable:
            raise InvalidRequest(f"replica table {target} belongs to another incarnation of {source}; remove it")
        storage.remove_tree(target)
        parent, pattern = checkpoints.rsplit("/", 1)
        _remove_children(parent, pattern)
    txn = DeltaTxn(spark, source)
    schema = spark.read.format("delta").load(source).schema
    builder = SparkDeltaTable.createIfNotExists(spark).location(target).addColumns(schema)
    if txn.partition_columns:
        builder = builder.partitionedBy(*txn.partition_columns)
    for key, value in {**txn.configuration, **identity, "lakebroker.replicaOf": source}.items():
        builder = builder.property(key, value)
    builder.execute()


def _drop_deleted_topics(replica: Replica, topics: list[TopicConfig]) -> None:
    """A topic deleted on the primary is deleted on the replica too (with its checkpoints)."""
    live = {t.location.removeprefix("topics/") for t in topics}
    names = {t.name for t in topics}
    for directory in storage.child_names(f"{replica.root}/topics"):
        if directory not in live:
            storage.remove_tree(f"{replica.root}/topics/{directory}")
            name = directory.partition("~")[0]  # (a location of a topic created again: TopicStore.create)
            if name not in names:
                _remove_children(f"{replica.root}/_replication/checkpoints/topics", f"{name}-*")


def _remove_children(parent: str, pattern: str) -> None:
    for name in storage.child_names(parent):
        if fnmatch.fnmatchcase(name, pattern):
            storage.remove_tree(f"{parent}/{name}")


def main(argv: list[str] | None = None) -> int:
    p = parser(JobName.REPLICATION, "Copy every table incrementally to a second storage location.")
    p.add_argument("--to", help="Replica location (default: the replication_uri setting).")
    p.add_argument("--topic", help="Only this topic (default: every topic and the system tables).")
    args = p.parse_args(argv)
    settings = settings_from(args)

    def validate() -> None:
        resolve_replica(args.to or settings.replication_uri, settings.data_dir, settings.tables_uri)
        select_topics(Layout.of(settings, for_spark=True), args.topic)

    return entry_main(JobName.REPLICATION, run, args, settings, validate, topic=args.topic, to=args.to)


if __name__ == "__main__":
    exit_without_teardown(main())  # not sys.exit: Arrow can abort in the teardown (tables/logs.py)
