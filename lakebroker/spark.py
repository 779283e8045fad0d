"""Topics from Spark: `read_topic(spark, topic, starting=..., ending=...)` returns a topic as a
DataFrame of decoded messages between two positions (installed with the `spark` extra).

    from lakebroker.spark import TableVersion, read_topic

    orders = read_topic(spark, "orders", starting={0: 100}, ending="latest")

The session may be the one `lakebroker` builds (`spark_pipeline/session.py`) or the user's own with
Delta configured: docs/analysts.md says what it needs.
"""

from lakebroker.spark_pipeline.topic_reads import Position, TableVersion, read_topic

__all__ = ["Position", "TableVersion", "read_topic"]
