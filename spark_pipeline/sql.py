"""`lakebroker sql`: one Spark SQL query over the registered tables."""

from __future__ import annotations

from typing import Any

from spark_pipeline.catalog import register_tables
from spark_pipeline.session import build_spark_session
from tables.errors import InvalidRequest
from tables.layout import Layout
from tables.settings import Settings


def spark_for(settings: Settings, app_name: str) -> Any:
    spark = build_spark_session(master=settings.spark_master, jars_dir=settings.jars_dir, app_name=app_name,
                                extra_conf={"spark.driver.memory": settings.spark_driver_memory,
                                            # CREATE DATABASE writes here: keep it in the data dir, not the cwd.
                                            "spark.sql.warehouse.dir": str((settings.data_dir / "_spark").resolve())})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def one_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def run_query(settings: Settings, query: str, limit: int) -> tuple[list[str], list[list[Any]]]:
    from pyspark.errors import PySparkException

    if not query.strip():
        raise InvalidRequest("the query is empty")
    spark = spark_for(settings, "lakebroker-sql")
    try:
        register_tables(spark, Layout.of(settings, for_spark=True))
        try:
            frame = spark.sql(query)
            rows = frame.limit(limit).collect()
        except PySparkException as exc:
            raise InvalidRequest(f"query failed: {one_line(exc)}") from None
        return list(frame.columns), [list(row) for row in rows]
    finally:
        spark.stop()
