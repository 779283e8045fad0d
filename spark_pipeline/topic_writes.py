"""A DataFrame published to a topic through the broker, exactly once.

Each Spark task sends its rows as Arrow record batches to `POST /v1/topics/{topic}/batch` (the
Python client's `Producer.send_arrow`: straight to each partition's owner, retried on 429/503 and
lost connections), and the broker assigns the offsets. Nothing is appended to the topic table
behind the broker's back, which would break dense offsets, dedup and delivery.

Exactly once comes from producer sequences, as Kafka's idempotent producer has them: each task is
a producer, `<write id>:<Spark partition>`, and each row's number in it is its sequence. A task
Spark runs again, a stage it recomputes, or a micro-batch a restarted query replays sends the same
producers and sequences, and the broker answers the rows it holds already as duplicates instead of
storing them again: it keeps each producer's highest sequence per partition within its dedup
window (`dedup_window_s`, an hour by default; ingest_api/sequences.py), one entry per task and
partition whatever the write's size. That holds while a partition's rows come in the same order
each time it is computed (Spark's own task retries assume a deterministic plan too). A DataFrame
with a stable unique key per row can name that column as `id` instead; those rows are deduplicated
by id, among the newest `dedup_max_entries` ids the broker placed, and a row whose id is null is
refused (it could not be deduplicated).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lakebroker.tables.settings import Settings

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

Ack = Literal["none", "wal", "table"]
RESULT_SCHEMA = "messages long, duplicates long"
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Structured Streaming on the threads of a query


@dataclass(frozen=True)
class Published:
    """What a write sent: messages, and how many of them the broker already held (a retry's)."""

    messages: int
    duplicates: int


def write_to_topic(df: DataFrame, topic: str, *, value: str = "value", key: str | None = None,
                   headers: str | None = None, partition: str | None = None, id: str | None = None,
                   broker_url: str | None = None, token: str | None = None, ack: Ack = "wal",
                   write_id: str | None = None, max_rows: int = 5000) -> Published:
    """Publish every row of `df` to `topic` as one message, exactly once (see the module's notes).

    value: the column of message values (binary, or string: stored as text). key, headers,
    partition: optional columns of keys (string; Kafka's murmur2 picks the partition), headers (map
    of string to string) and explicit partitions. id: a column of message ids, unique and stable
    per row; without one each task is a producer under `write_id` and each row's place in it its
    sequence (default: a new write id per call; pass the same one to make a re-run of the same
    input idempotent). A row
    whose `id` is null is not sent: its task raises ValueError naming the row, which fails the write.
    broker_url: any node of the broker (default: the environment's `LAKEBROKER_ADVERTISED_URL`,
    else this machine's `LAKEBROKER_PORT`). ack: as for any produce; the write returns once every
    message is acknowledged so. A row the broker refuses fails the write with Spark's error, which
    carries the client's RequestRefused naming the column or row; the rows sent before it stay.
    Raises ValueError for a column `df` lacks, before anything is sent."""
    if ack not in ("none", "wal", "table"):
        raise ValueError(f"ack must be 'none', 'wal' or 'table', not {ack!r}")
    if max_rows < 1:
        raise ValueError("max_rows must be positive")
    wire = _wire_columns(df, value=value, key=key, headers=headers, partition=partition, id=id)
    send = _sender(topic, broker_url or _default_url(), token, ack, write_id or uuid.uuid4().hex, max_rows, id)
    from pyspark.sql import functions as F

    totals = df.select(*wire).mapInArrow(send, RESULT_SCHEMA) \
        .agg(F.sum("messages").alias("messages"), F.sum("duplicates").alias("duplicates")).collect()[0]
    return Published(int(totals["messages"] or 0), int(totals["duplicates"] or 0))


def topic_sink(topic: str, *, sink_id: str | None = None, **options: Any) -> Callable[[DataFrame, int], None]:
    """`write_to_topic` for `df.writeStream.foreachBatch(topic_sink("t"))`: each micro-batch is
    written under the id `<query id>:<batch id>`, so a batch the query replays after a restart from
    its checkpoint (it failed between sending and committing) sends the same ids and is stored once.
    The query id is the one Structured Streaming keeps in the checkpoint; `sink_id` replaces it
    (for a new checkpoint that must not resend what an old one sent, keep the old sink_id). Other
    options are write_to_topic's."""
    if "write_id" in options:
        raise ValueError("topic_sink names each batch's writes itself; pass sink_id instead of write_id")

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        query = sink_id or batch.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query:
            raise ValueError("no streaming query id in this thread: pass topic_sink(..., sink_id=...)")
        write_to_topic(batch, topic, write_id=f"{query}:{batch_id}", **options)

    return write_batch


def _wire_columns(df: DataFrame, **columns: str | None) -> list[Any]:
    from pyspark.sql import functions as F

    have = set(df.columns)
    missing = [c for c in columns.values() if c is not None and c not in have]
    if missing:
        raise ValueError(f"the DataFrame has no column {', '.join(map(repr, missing))} (it has {sorted(have)})")
    return [F.col(source).alias(name) for name, source in columns.items() if source is not None]


def _default_url() -> str:
    settings = Settings()
    return (settings.advertised_url or f"http://127.0.0.1:{settings.port}").rstrip("/")


def _sender(topic: str, url: str, token: str | None, ack: Ack, write_id: str, max_rows: int,
            id_column: str | None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each task runs (pickled to the executors: plain values only)."""

    def send(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        from lakebroker_client import Producer

        context = TaskContext.get()
        partition = 0 if context is None else context.partitionId()
        producer_id = pa.scalar(f"{write_id}:{partition}")
        rows = duplicates = 0
        with Producer(url, token) as producer:
            for batch in batches:
                if not batch.num_rows:
                    continue
                table = pa.Table.from_batches([batch])
                if id_column is None:  # the task is a producer, its rows' numbers the sequence (sequences.py)
                    table = table.append_column("producer_id", pa.repeat(producer_id, batch.num_rows))
                    table = table.append_column("sequence", pa.array(range(rows, rows + batch.num_rows), pa.int64()))
                elif table.column("id").null_count:
                    # The broker would store it without an id, so a retry or re-run would store it again.
                    first = pc.index(pc.is_null(table.column("id")), True).as_py()
                    raise ValueError(f"row {rows + first} of Spark partition {partition} has a null id (column "
                                     f"{id_column!r}): every row needs an id, or leave out id= to use each "
                                     "row's place in the write")
                answers = producer.send_arrow(topic, table, ack=ack, max_rows=max_rows)
                duplicates += pc.sum(answers.column("duplicate")).as_py() or 0
                rows += batch.num_rows
        yield pa.RecordBatch.from_pydict({"messages": [rows], "duplicates": [duplicates]},
                                         schema=pa.schema([("messages", pa.int64()), ("duplicates", pa.int64())]))

    return send
