"""`lakebroker sql`: one Spark SQL query over the registered tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lakebroker.spark_pipeline.catalog import sql_over_tables
from lakebroker.spark_pipeline.session import build_spark_session
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings


def cli_jvm_log(settings: Settings, command: str) -> Path:
    """Where the driver JVM of a `lakebroker <command>` run writes its output (the last run's)."""
    return settings.data_dir / "_jobs" / f"cli-{command}.log"


def spark_for(settings: Settings, app_name: str, *, jvm_log: Path | None = None) -> Any:
    spark = build_spark_session(master=settings.spark_master, jars_dir=settings.spark_jars_dir, app_name=app_name,
                                extra_conf={"spark.driver.memory": settings.spark_driver_memory,
                                            # CREATE DATABASE writes here: keep it in the data dir, not the cwd.
                                            "spark.sql.warehouse.dir": str((settings.data_dir / "_spark").resolve()),
                                            **settings.spark_conf},
                                jvm_log=jvm_log)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def one_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def run_query(settings: Settings, query: str, limit: int, *, verbose: bool = False,
              jvm_log: Path | None = None) -> tuple[list[str], list[list[Any]]]:
    """Columns and at most `limit` rows; a failing query is one InvalidRequest line (`verbose`: the
    whole message, with the query context and the JVM stack)."""
    from pyspark.errors import PySparkException
    from pyspark.logger import PySparkLogger

    if not query.strip():
        raise InvalidRequest("the query is empty")
    # pyspark logs each failed query's error and stack to stderr itself, as JSON; it is reported once, below.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True
    spark = spark_for(settings, "lakebroker-sql", jvm_log=jvm_log)
    # str() of a captured JVM error appends the JVM stack when this is on.
    spark.conf.set("spark.sql.pyspark.jvmStacktrace.enabled", str(verbose).lower())
    try:
        try:
            frame = sql_over_tables(spark, Layout.of(settings, for_spark=True), query)
            rows = frame.limit(limit).collect()
        except PySparkException as exc:
            detail = str(exc).strip() if verbose else f"{one_line(exc)} (--verbose for the Java stack)"
            raise InvalidRequest(f"query failed: {detail}") from None
        return list(frame.columns), [list(row) for row in rows]
    finally:
        spark.stop()
