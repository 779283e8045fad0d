"""Reverse ETL with lakebroker: a daily Spark job publishes its result to a topic, and the topic's
subscriptions deliver each row to other services as a signed, retried webhook.

Each run reads the `orders` topic's messages of its day (values like {"amount": 42}, keyed by
customer), sums them per customer, and publishes one message per customer to `daily-totals`, keyed
by customer. The write id is the DAG and the day, so a retried or re-run day stores nothing twice.

Set up once (any node of the broker):

    lakebroker topics create daily-totals --partitions 3
    curl -XPOST localhost:8080/v1/subscriptions -H 'content-type: application/json' \
         -d '{"name": "finance", "topic": "daily-totals", "url": "https://finance.example.com/hook"}'

The task reads the tables where `lakebroker` does (LAKEBROKER_DATA_DIR, LAKEBROKER_TABLES_URI) and
publishes to the broker named by the `broker_url` param.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, task


@dag(dag_id="lakebroker_publish_daily_totals", schedule="@daily", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     catchup=False, max_active_runs=1,
     params={"broker_url": Param("http://127.0.0.1:8080", type="string"),
             "source": Param("orders", type="string"), "topic": Param("daily-totals", type="string")})
def publish_daily_totals() -> None:
    @task
    def publish(params: dict[str, Any] | None = None, logical_date: datetime | None = None) -> dict[str, int]:
        from pyspark.sql import functions as F

        from lakebroker.spark import read_topic, spark_session, write_to_topic

        assert params is not None and logical_date is not None
        day = datetime(logical_date.year, logical_date.month, logical_date.day, tzinfo=UTC)
        spark = spark_session(app_name="lakebroker-daily-totals")
        orders = read_topic(spark, params["source"], starting=day, ending=day + timedelta(days=1))
        totals = (orders.where(F.col("key").isNotNull())
                  .groupBy(F.col("key").alias("customer"))
                  .agg(F.sum(F.get_json_object("value", "$.amount").cast("decimal(18,2)")).alias("total"),
                       F.count("*").alias("orders"))
                  .select("customer", F.to_json(F.struct(F.lit(day.date().isoformat()).alias("day"), "customer",
                                                         "total", "orders")).alias("json")))
        published = write_to_topic(totals, params["topic"], key="customer", value="json",
                                   broker_url=params["broker_url"], ack="table",
                                   write_id=f"lakebroker_publish_daily_totals:{day.date().isoformat()}")
        return {"messages": published.messages, "duplicates": published.duplicates}

    publish()


publish_daily_totals()
