"""Exact Delta commits from Spark: the one owner of the py4j calls into Delta's transaction API.

Open-source Delta has no public API for "remove exactly these files and add these", which is what
ordered bin-packing, whole-file retention and key compaction need, so this module drives
`DeltaLog` / `OptimisticTransaction` (Delta 4.4.0, pinned in spark_pipeline/maven/delta/pom.xml) the way Delta's
own OPTIMIZE does:

* the transaction registers only the files it read (`trackFilesRead`), never a read predicate, so
  the flusher's concurrent appends (delta-rs, put-if-absent) never conflict with it, while a
  concurrent job that removed the same files does (ConcurrentDeleteReadException; we re-plan);
* rearrangement commits (compaction) are `dataChange=false` and run at snapshot isolation, so a
  Delta stream (replication) ignores them;
* the txn actions the ingest tier relies on (`lakebroker.partition.{p}`) are part of the table
  state and are carried by every commit and checkpoint; nothing here reads them inside a job's
  transaction (reading a txn appId makes every flusher commit a conflict).

Spark's commit goes through AtomicLocalLogStore (spark_pipeline/session.py), so neither side can
overwrite the other's commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from lakebroker.spark_pipeline.plans import FileEntry
from lakebroker.tables import delta, storage
from lakebroker.tables.conflicts import retry_conflicts
from lakebroker.tables.errors import LakebrokerError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
T = TypeVar("T")

# Exceptions (by Java class name) meaning "someone else changed the files we planned on": re-plan.
_CONFLICTS = (
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentAppendException",
    "ConcurrentTransactionException",
    "MetadataChangedException",
    "ProtocolChangedException",
)


class DeltaConflict(Exception):
    """A concurrent commit invalidated this transaction's plan; re-plan from a fresh snapshot."""


class TableReplaced(LakebrokerError):
    """The table was deleted (and perhaps created again) while this transaction ran: nothing of it
    may land there. Not retried: the topic it was planned for is gone."""

    status = 409
    code = "table_replaced"


def is_conflict(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(name in text for name in _CONFLICTS)


def jvm_of(spark: SparkSession) -> Any:
    """The py4j view of the driver JVM (untyped)."""
    return spark._jvm


def table_exists(spark: SparkSession, uri: str) -> bool:
    # delta-rs answers from a listing in milliseconds; Spark's check costs a query (seconds in a cold JVM).
    if storage.delta_rs_reads(uri):
        return delta.exists(uri)
    return bool(jvm_of(spark).io.delta.tables.DeltaTable.isDeltaTable(spark._jsparkSession, uri))


def app_version(spark: SparkSession, uri: str, app_id: str) -> int | None:
    """The latest version's txn version for an appId, outside any transaction (from the log with
    delta-rs where it reaches the table; `DeltaTxn.app_version` is the in-transaction read)."""
    if storage.delta_rs_reads(uri):
        return delta.txn_version(delta.load(uri), app_id)
    return DeltaTxn(spark, uri).app_version(app_id)


class DeltaTxn:
    """One optimistic transaction on one Delta table."""

    def __init__(self, spark: SparkSession, uri: str) -> None:
        self.spark = spark
        self.uri = uri
        self._jvm = jvm_of(spark)
        self._delta = self._jvm.org.apache.spark.sql.delta
        self._log = self._delta.DeltaLog.forTable(spark._jsparkSession, uri)
        self._txn = self._log.startTransaction()
        self._snapshot = self._txn.snapshot()
        self._table_id = str(self._snapshot.metadata().id())  # a table created again gets a new one
        self._java_files: dict[str, Any] = {}

    # -- reading the snapshot ------------------------------------------------------------------
    @property
    def read_version(self) -> int:
        return int(self._txn.readVersion())

    @property
    def partition_columns(self) -> list[str]:
        return [str(c) for c in self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(
            self._snapshot.metadata().partitionColumns())]

    @property
    def configuration(self) -> dict[str, str]:
        conf = self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(self._snapshot.metadata().configuration())
        return {str(k): str(v) for k, v in dict(conf).items()}

    def files(self, partition: int | None = None) -> list[FileEntry]:
        """The snapshot's data files (optionally one partition's), with their statistics."""
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        frame = DataFrame(self._snapshot.allFiles().toDF(), self.spark)
        if partition is not None:
            frame = frame.where(F.col("partitionValues").getItem("partition") == str(partition))
        rows = frame.select("path", "partitionValues", "size", "stats").collect()
        return [FileEntry.from_add(r["path"], r["partitionValues"], r["size"], r["stats"]) for r in rows]

    def _adds(self, files: Sequence[FileEntry]) -> list[Any]:
        """The Java AddFile actions of these files, as this snapshot has them."""
        from pyspark.sql import functions as F

        missing = [f.path for f in files if f.path not in self._java_files]
        for start in range(0, len(missing), 5000):
            chunk = missing[start:start + 5000]
            found = self._snapshot.allFiles().where(F.col("path").isin(chunk)._jc).collectAsList()
            for add in found:
                self._java_files[str(add.path())] = add
        absent = [f.path for f in files if f.path not in self._java_files]
        if absent:
            raise DeltaConflict(f"{len(absent)} planned files are no longer in {self.uri} (e.g. {absent[0]})")
        return [self._java_files[f.path] for f in files]

    def read(self, files: Sequence[FileEntry]) -> DataFrame:
        """A DataFrame over exactly these files (partition columns included), as OPTIMIZE reads a bin."""
        from pyspark.sql import DataFrame

        seq = self._seq(self._adds(files))
        jdf = self._log.createDataFrame(self._snapshot, seq, False, self._jvm.scala.Option.apply("lakebroker"))
        return DataFrame(jdf, self.spark)

    def app_version(self, app_id: str) -> int | None:
        """The table's txn version for an appId; this transaction then conflicts with any change to it."""
        version = int(self._txn.txnVersion(app_id))
        return None if version < 0 else version

    # -- writing -------------------------------------------------------------------------------
    def write(self, frame: DataFrame, *, data_change: bool) -> list[Any]:
        """Write a DataFrame as new data files of this table (uncommitted); returns their AddFiles."""
        written = self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(self._txn.writeFiles(frame._jdf))
        adds = [a for a in written if str(a.getClass().getSimpleName()) == "AddFile"]
        return adds if data_change else [self._rearranged(a) for a in adds]

    @staticmethod
    def _rearranged(add: Any) -> Any:
        """The same AddFile marked dataChange=false (what OPTIMIZE commits)."""
        return add.copy(add.path(), add.partitionValues(), add.size(), add.modificationTime(), False, add.stats(),
                        add.tags(), add.deletionVector(), add.baseRowId(), add.defaultRowCommitVersion(),
                        add.clusteringProvider(), getattr(add, "copy$default$12")(),
                        getattr(add, "copy$default$13")())

    def set_properties(self, properties: Mapping[str, str]) -> None:
        """Set table properties in this transaction's commit (the schema and partitioning stay)."""
        m = self._snapshot.metadata()
        conf = self._jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(
            self._jvm.java.util.HashMap({**self.configuration, **properties}))
        self._txn.updateMetadata(m.copy(m.id(), m.name(), m.description(), m.format(), m.schemaString(),
                                        m.partitionColumns(), conf, m.createdTime()), False)

    def set_properties_op(self, properties: Mapping[str, str]) -> Any:
        return getattr(self._delta, "DeltaOperations$SetTableProperties")(
            self._jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(self._jvm.java.util.HashMap(dict(properties))))

    def removes(self, files: Sequence[FileEntry], *, data_change: bool) -> list[Any]:
        adds = self._adds(files)
        self._txn.trackFilesRead(self._seq(adds))
        now = int(time.time() * 1000)
        return [a.removeWithTimestamp(now, data_change) for a in adds]

    def added_files(self, adds: Iterable[Any]) -> list[FileEntry]:
        """FileEntry views (with statistics) of AddFiles this transaction wrote."""
        convert = self._jvm.scala.jdk.javaapi.CollectionConverters.asJava
        out = []
        for a in adds:
            values = {str(k): None if v is None else str(v) for k, v in dict(convert(a.partitionValues())).items()}
            out.append(FileEntry.from_add(str(a.path()), values, int(a.size()),
                                          None if a.stats() is None else str(a.stats())))
        return out

    def commit(self, actions: Sequence[Any], operation: Any, *, tags: Mapping[str, str] | None = None,
               app_versions: Mapping[str, int] | None = None, metrics: Mapping[str, int] | None = None) -> int:
        """Commit the actions (plus txn appId versions); raises DeltaConflict on a conflicting commit.

        `metrics` become the commit's operationMetrics (DESCRIBE HISTORY); file and byte counts of
        the adds and removes are filled in here.
        """
        all_actions = list(actions)
        self._register_metrics(all_actions, metrics or {})
        for app_id, version in (app_versions or {}).items():
            all_actions.append(self._delta.actions.SetTransaction(
                app_id, version, self._jvm.scala.Option.apply(self._jvm.java.lang.Long(int(time.time() * 1000)))))
        jtags = self._jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(
            self._jvm.java.util.HashMap(dict(tags or {})))
        self._check_same_table()
        try:
            return int(self._txn.commit(self._seq(all_actions), operation, jtags))
        except Exception as exc:
            if is_conflict(exc):
                raise DeltaConflict(str(exc).splitlines()[0][:500]) from exc
            raise

    def _check_same_table(self) -> None:
        """Raise TableReplaced if the table was deleted since this transaction began. Delta looks for
        conflicts in the commits after the one it read, but a table created again starts its log at
        version 0, where it finds none of them: the commit would land in the new table, past its end."""
        none = self._jvm.scala.Option.empty()
        try:
            latest = self._log.update(False, none, none)
            table_id, version = str(latest.metadata().id()), int(latest.version())
        except Exception as exc:  # a log that cannot be read now is no table to commit to
            raise TableReplaced(f"{self.uri}: the table can no longer be read ({type(exc).__name__}); "
                                "its topic was deleted while the job ran") from exc
        if table_id != self._table_id or version < self.read_version:
            raise TableReplaced(f"{self.uri}: the table was deleted and created again while the job ran "
                                "(its topic is a new log now); nothing of this run is committed")

    def _register_metrics(self, actions: Sequence[Any], given: Mapping[str, int]) -> None:
        adds = [a for a in actions if str(a.getClass().getSimpleName()) == "AddFile"]
        removes = [a for a in actions if str(a.getClass().getSimpleName()) == "RemoveFile"]
        added_bytes = sum(int(a.size()) for a in adds)
        removed_bytes = sum(int(r.getFileSize()) for r in removes)
        values = {"numAddedFiles": len(adds), "numRemovedFiles": len(removes), "numAddedBytes": added_bytes,
                  "numRemovedBytes": removed_bytes, "numFiles": len(adds), "numOutputBytes": added_bytes,
                  "numDeletedRows": 0, "numCopiedRows": 0, **given}
        sc = self.spark.sparkContext._jsc.sc()
        create = self._jvm.org.apache.spark.sql.execution.metric.SQLMetrics.createMetric
        registered = self._jvm.java.util.HashMap()
        for name, value in values.items():
            metric = create(sc, name)
            metric.set(int(value))
            registered.put(name, metric)
        self._txn.registerSQLMetrics(self.spark._jsparkSession,
                                     self._jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(registered))

    # -- operations (as DESCRIBE HISTORY shows them) ----------------------------------------------
    def _expressions(self, predicates: Sequence[str]) -> Any:
        parser = self.spark._jsparkSession.sessionState().sqlParser()
        return self._seq([parser.parseExpression(p) for p in predicates])

    def optimize_op(self, predicates: Sequence[str]) -> Any:
        empty = self._seq([])
        return getattr(self._delta, "DeltaOperations$Optimize")(
            self._expressions(predicates), empty, False, self._jvm.scala.Option.empty(), False)

    def delete_op(self, predicates: Sequence[str]) -> Any:
        return getattr(self._delta, "DeltaOperations$Delete")(self._expressions(predicates))

    def append_op(self) -> Any:
        none = self._jvm.scala.Option.empty()
        mode = self._jvm.org.apache.spark.sql.SaveMode.Append
        return getattr(self._delta, "DeltaOperations$Write")(mode, none, none, none, none, none, none, none, none)

    def _seq(self, items: Sequence[Any]) -> Any:
        return self._jvm.org.apache.spark.api.python.PythonUtils.toSeq(self._jvm.java.util.ArrayList(list(items)))

    # -- log maintenance -----------------------------------------------------------------------


def maintain_log(uri: str) -> int:
    """Checkpoint the table's latest version, then delete the log files it supersedes that are
    older than the table's `delta.logRetentionDuration` (30 days by default). Returns the version.

    Done with delta-rs: it checkpoints in milliseconds where Spark runs a job, and it expires log
    files by age alone (Spark's own cleanup rounds the cutoff down to a whole day and keeps every
    file after the newest *expired* checkpoint, so it rarely deletes anything on a table that each
    run checkpoints). txn actions are part of the checkpoint, so cleanup never loses one; time
    travel to a cleaned-up version is gone, as with any Delta log cleanup.
    """
    from lakebroker.tables import delta

    table = delta.load(uri)
    table.create_checkpoint()
    table.cleanup_metadata()
    return int(table.version())


def with_retries(what: str, attempts: int, work: Callable[[], T]) -> T:
    """Run `work()` again (re-planning from a fresh snapshot) when a concurrent job conflicts."""
    return retry_conflicts(work, what=what, attempts=attempts, pause_s=0.4, conflicts=(DeltaConflict,), warn=True)
