"""Topics from Spark (installed with the `spark` extra):

- `read_topic(spark, topic, starting=..., ending=...)`: a topic as a DataFrame of decoded messages
  between two positions;
- `write_to_topic(df, topic, key=..., value=...)`: every row of a DataFrame published to a topic
  through the broker, exactly once; `topic_sink(topic, ...)` the same for `foreachBatch`.

    from lakebroker.spark import TableVersion, read_topic, write_to_topic

    orders = read_topic(spark, "orders", starting={0: 100}, ending="latest")
    write_to_topic(totals, "daily-totals", key="customer", value="json", broker_url="http://broker:8080")

The session may be the one `lakebroker` builds (`spark_pipeline/session.py`) or the user's own with
Delta configured: docs/analysts.md says what it needs.
"""

from lakebroker.spark_pipeline.topic_reads import Position, TableVersion, read_topic
from lakebroker.spark_pipeline.topic_writes import Published, topic_sink, write_to_topic

__all__ = ["Position", "Published", "TableVersion", "read_topic", "topic_sink", "write_to_topic"]
