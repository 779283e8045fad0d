"""Registers every lakebroker table in a Spark session's catalog, for analysts and jobs.

Topics appear under their own names (`SELECT ... FROM orders`), as catalog tables rather
than views so that time travel (`VERSION AS OF`, `TIMESTAMP AS OF`) and `DESCRIBE HISTORY`
work. System tables appear in the `lakebroker` database: `lakebroker.topics`,
`lakebroker.consumer_offsets`, `lakebroker.dead_letters`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tables import delta
from tables.layout import Layout
from tables.topics import TopicStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _quote(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def _register(spark: SparkSession, name: str, location: str) -> None:
    if delta.exists(location):
        spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING delta LOCATION '{location}'")


def register_tables(spark: SparkSession, layout: Layout) -> list[str]:
    """Register every topic and system table; returns the topic names registered."""
    topics = sorted(TopicStore(layout).load())
    for topic in topics:
        _register(spark, _quote(topic), layout.topic_table(topic))
    spark.sql("CREATE DATABASE IF NOT EXISTS lakebroker")
    _register(spark, "lakebroker.topics", layout.topics_table)
    _register(spark, "lakebroker.consumer_offsets", layout.offsets_table)
    _register(spark, "lakebroker.dead_letters", layout.dead_letters_table)
    return topics
