"""Registers lakebroker tables in a Spark session's catalog, for analysts and jobs.

Topics appear under their own names (`SELECT ... FROM orders`), as catalog tables rather
than views so that time travel (`VERSION AS OF`, `TIMESTAMP AS OF`) and `DESCRIBE HISTORY`
work. System tables appear in the `lakebroker` database: `lakebroker.topics`,
`lakebroker.consumer_offsets`, `lakebroker.dead_letters`.

Registering a table makes Delta read its log: a second or more per table in a fresh JVM, so
`lakebroker sql` registers only the tables its statement names (`sql_over_tables`), while a
session for analysts (`register_tables`) gets them all.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.topics import TopicStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SYSTEM_DATABASE = "lakebroker"
_IDENTIFIER_PART = re.compile(r"`((?:[^`]|``)*)`|([^.`]+)")


def _quote(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def catalog_tables(layout: Layout) -> dict[str, str]:
    """Every table lakebroker registers: its catalog name -> its location."""
    tables = {name: layout.topic_table(topic) for name, topic in sorted(TopicStore(layout).load().items())}
    tables[f"{SYSTEM_DATABASE}.topics"] = layout.topics_table
    tables[f"{SYSTEM_DATABASE}.consumer_offsets"] = layout.offsets_table
    tables[f"{SYSTEM_DATABASE}.dead_letters"] = layout.dead_letters_table
    return tables


def _register(spark: SparkSession, name: str, location: str) -> None:
    if not delta.exists(location):
        return
    database, _, table = name.rpartition(".") if name.startswith(f"{SYSTEM_DATABASE}.") else ("", "", name)
    qualified = f"{database}.{_quote(table)}" if database else _quote(table)
    spark.sql(f"CREATE TABLE IF NOT EXISTS {qualified} USING delta LOCATION '{location}'")


def register_tables(spark: SparkSession, layout: Layout) -> list[str]:
    """Register every topic and system table; returns the topic names registered."""
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {SYSTEM_DATABASE}")
    tables = catalog_tables(layout)
    for name, location in tables.items():
        _register(spark, name, location)
    return [name for name in tables if not name.startswith(f"{SYSTEM_DATABASE}.")]


def sql_over_tables(spark: SparkSession, layout: Layout, statement: str) -> DataFrame:
    """`spark.sql(statement)` with the lakebroker tables it names registered first.

    Spark analyzes a statement when it is given one; each table it cannot find, if it is one of
    ours, is registered and the statement analyzed again. A `SHOW` statement lists the catalog,
    so it gets every table."""
    from pyspark.errors import AnalysisException

    spark.sql(f"CREATE DATABASE IF NOT EXISTS {SYSTEM_DATABASE}")
    if statement.lstrip()[:4].upper() == "SHOW":
        register_tables(spark, layout)
        return spark.sql(statement)
    tables = {name.lower(): (name, location) for name, location in catalog_tables(layout).items()}
    registered: set[str] = set()
    while True:
        try:
            return spark.sql(statement)
        except AnalysisException as exc:
            missing = _missing_table(exc)
            if missing is None or missing not in tables or missing in registered:
                raise
            registered.add(missing)
            _register(spark, *tables[missing])


def _missing_table(exc: Exception) -> str | None:
    """The lower-cased catalog name of the table an analysis error could not find, if that is the error."""
    condition = getattr(exc, "getCondition", lambda: None)()
    if condition != "TABLE_OR_VIEW_NOT_FOUND":
        return None
    parameters: dict[str, str] = getattr(exc, "getMessageParameters", dict)() or {}
    relation = parameters.get("relationName")
    if not relation:
        return None
    parts = [quoted.replace("``", "`") if quoted else bare.strip()
             for quoted, bare in _IDENTIFIER_PART.findall(relation)]
    if parts[:1] == ["spark_catalog"]:
        parts = parts[1:]
    if parts[:1] == ["default"] and len(parts) == 2:
        parts = parts[1:]
    return ".".join(parts).lower()
