"""A topic read as a Spark DataFrame, between two positions, over one snapshot of its table.

Positions are a subscription's: `"earliest"`, `"latest"`, a timestamp (an aware datetime: the
log-append time, which never goes backwards within a partition), a per-partition offset map, or a
table version (`TableVersion(v)`: where each partition's committed end stood at version v, read from
the `lakebroker.partition.<p>` transactions the flusher commits with the rows). `starting` is
inclusive, `ending` exclusive, as Kafka's batch source takes them; a partition the map leaves out
starts at the earliest and ends at the latest.

The read is pinned to one table version (the ending's, or the newest when the read is planned), so
"latest" is one point for every partition, and rows committed while the query runs are not half in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from lakebroker.tables import delta, storage
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, TopicStore

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


@dataclass(frozen=True)
class TableVersion:
    """A position: where each partition's committed end stood at this version of the topic table."""

    version: int


Position = Literal["earliest", "latest"] | datetime | Mapping[int, int] | TableVersion
TEXT_FORMATS = ("json", "text")


def read_topic(spark: SparkSession, topic: str, *, starting: Position | None = None,
               ending: Position | None = None, settings: Settings | None = None) -> DataFrame:
    """The messages of `topic` from `starting` (default earliest) to before `ending` (default latest):
    partition, offset, timestamp, key, value (a string for json and text, null for binary and
    tombstones), value_bytes (the bytes as stored), format and headers. Unordered, as any
    DataFrame: sort by partition and offset where order matters.

    `settings` says where the tables are (default: the environment's, as `lakebroker` reads it).
    Raises NotFound for an unknown topic, ValueError for a position that is not one."""

    layout = Layout.of(settings or Settings())
    config = TopicStore(layout).get(topic)
    uri = layout.topic_table(config)
    newest = delta.load(uri).version()
    version = ending.version if isinstance(ending, TableVersion) else newest
    if not 0 <= version <= newest:
        raise ValueError(f"topic {topic!r} has table versions 0 to {newest}, not {version}")
    rows = spark.read.format("delta").option("versionAsOf", version).load(storage.spark_uri(uri))
    if starting is not None:
        rows = rows.where(position_bound(starting, config, uri, version, lower=True))
    if ending is not None and not isinstance(ending, TableVersion):
        rows = rows.where(position_bound(ending, config, uri, version, lower=False))
    return decoded(rows)


def decoded(rows: DataFrame) -> DataFrame:
    """A topic table's rows as a reader gets them: the value decoded for json and text, beside its bytes."""
    from pyspark.sql import functions as F

    return rows.select(
        "partition", "offset", "timestamp", "key",
        F.when(F.col("format").isin(*TEXT_FORMATS), F.decode(F.col("value"), "UTF-8")).alias("value"),
        F.col("value").alias("value_bytes"), "format", "headers",
    )


def position_bound(position: Position, config: TopicConfig, uri: str, version: int, *, lower: bool) -> Column:
    """The rows at or after (`lower`) or before `position`."""
    from pyspark.sql import functions as F

    if position == "earliest":
        return F.lit(True) if lower else F.lit(False)
    if position == "latest":
        if not lower:
            return F.lit(True)
        return _offsets(ends_at(uri, version, config.partitions), config, lower=True)
    if isinstance(position, datetime):
        if position.tzinfo is None:
            raise ValueError(f"timestamp {position.isoformat()} has no time zone: give an aware datetime")
        return F.col("timestamp") >= F.lit(position) if lower else F.col("timestamp") < F.lit(position)
    if isinstance(position, TableVersion):  # as a starting position: the ends at that version
        if not 0 <= position.version <= version:
            raise ValueError(f"starting version {position.version} is not between 0 and the read's {version}")
        return _offsets(ends_at(uri, position.version, config.partitions), config, lower=True)
    if isinstance(position, Mapping):
        return _offsets(position, config, lower=lower)
    raise ValueError(f"a position is 'earliest', 'latest', an aware datetime, a {{partition: offset}} map or a "
                     f"TableVersion, not {position!r}")


def _offsets(offsets: Mapping[int, int], config: TopicConfig, *, lower: bool) -> Column:
    from pyspark.sql import functions as F

    condition = F.lit(True)
    for partition, offset in offsets.items():
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < config.partitions:
            raise ValueError(f"topic {config.name!r} has partitions 0 to {config.partitions - 1}, not {partition!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"partition {partition}'s offset must be a non-negative int, not {offset!r}")
        inside = F.col("offset") >= offset if lower else F.col("offset") < offset
        condition = condition & ((F.col("partition") != partition) | inside)
    return condition


def ends_at(uri: str, version: int, partitions: int) -> dict[int, int]:
    table = delta.load(uri, version=version)
    return {p: delta.committed_end(table, p) for p in range(partitions)}
