"""Topics from Spark (installed with the `spark` extra):

- `read_topic(spark, topic, starting=..., ending=...)`: a topic as a DataFrame of decoded messages
  between two positions;
- `read_topic_stream(spark, topic, starting=..., group=...)`: the same as a streaming DataFrame,
  with a group's position committed after each micro-batch; `group_commits(spark, topic)` says
  how those commits went;
- `write_to_topic(df, topic, key=..., value=...)`: every row of a DataFrame published to a topic
  through the broker, exactly once; `topic_sink(topic, ...)` the same for `foreachBatch`;
- `spark_session()`: the session lakebroker builds, for the environment's settings.

    from lakebroker.spark import TableVersion, read_topic, write_to_topic

    orders = read_topic(spark, "orders", starting={0: 100}, ending="latest")
    write_to_topic(totals, "daily-totals", key="customer", value="json", broker_url="http://broker:8080")

The session may be the one `lakebroker` builds (`spark_pipeline/session.py`) or the user's own with
Delta configured: docs/analysts.md says what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakebroker.spark_pipeline.topic_reads import Position, TableVersion, read_topic
from lakebroker.spark_pipeline.topic_streams import GroupCommits, group_commits, read_topic_stream
from lakebroker.spark_pipeline.topic_writes import Published, topic_sink, write_to_topic
from lakebroker.tables.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["GroupCommits", "Position", "Published", "TableVersion", "group_commits", "read_topic", "read_topic_stream",
           "spark_session", "topic_sink", "write_to_topic"]


def spark_session(settings: Settings | None = None, *, app_name: str = "lakebroker") -> SparkSession:
    """The session `lakebroker sql` and the jobs use (Delta, the put-if-absent LogStore, S3A for tables
    on S3, this interpreter for Python workers), for the environment's settings by default."""
    from lakebroker.spark_pipeline.sql import spark_for

    session: SparkSession = spark_for(settings or Settings(), app_name)
    return session
