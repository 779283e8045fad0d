"""Columnar sends: a table's rows as Arrow IPC stream bodies, and the results back as Arrow.

Needs pyarrow (`pip install "lakebroker-client[arrow]"`); pandas and Polars frames are turned into
Arrow tables by their own converters, so neither is a dependency.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeAlias

    import pyarrow as pa

    ArrowTable: TypeAlias = pa.Table  # for the other modules' annotations, which import no pyarrow

ARROW_STREAM = "application/vnd.apache.arrow.stream"
WIRE_COLUMNS = ("value", "key", "headers", "partition", "id", "producer_id", "sequence")


def as_table(data: Any, columns: Mapping[str, str] | None) -> pa.Table:
    """`data` (a pyarrow Table or RecordBatch, a pandas or Polars DataFrame) as an Arrow table of
    the wire's columns: `columns` maps a wire name (value, key, headers, partition, id, producer_id,
    sequence) to the
    column of `data` that holds it; without it, the columns are taken by those names as they are."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ImportError('send_arrow needs pyarrow: pip install "lakebroker-client[arrow]"') from None
    if isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.Table):
        table = data
    elif type(data).__module__.split(".")[0] == "pandas":
        table = pa.Table.from_pandas(data, preserve_index=False)
    elif callable(getattr(data, "to_arrow", None)):  # Polars (and others that speak Arrow)
        table = data.to_arrow()
    else:
        raise TypeError(f"send_arrow takes a pyarrow Table or RecordBatch, or a pandas or Polars DataFrame, "
                        f"not {type(data).__name__}")
    if columns is not None:
        wrong = sorted(set(columns) - set(WIRE_COLUMNS))
        if wrong:
            raise ValueError(f"columns maps wire names ({', '.join(WIRE_COLUMNS)}), not {', '.join(wrong)}")
        missing = sorted(set(columns.values()) - set(table.column_names))
        if missing:
            raise ValueError(f"no column {', '.join(missing)} in the data (it has {', '.join(table.column_names)})")
        table = pa.table({wire: table.column(name) for wire, name in columns.items()})
    if "value" not in table.column_names:
        raise ValueError(f"no value column (the data has {', '.join(table.column_names)}): name one with "
                         "columns={'value': ...}")
    return table


def with_ids(table: pa.Table) -> pa.Table:
    """The table with an `id` column where it has none (nor producer_id and sequence): a random
    prefix and the row's number, so a retried request is answered from the broker's dedup index
    instead of stored again."""
    if "id" in table.column_names or "producer_id" in table.column_names:
        return table
    import pyarrow as pa
    import pyarrow.compute as pc

    prefix = uuid.uuid4().hex + ":"
    numbers = pc.cast(pa.array(range(table.num_rows), pa.int64()), pa.string())
    return table.append_column("id", pc.binary_join_element_wise(pa.scalar(prefix), numbers, ""))


def slices(table: pa.Table, max_rows: int, max_bytes: int) -> list[pa.Table]:
    """The table cut into requests of at most `max_rows` rows and, by its average row, `max_bytes`."""
    if table.num_rows == 0:
        return []
    per_row = max(1, table.nbytes // table.num_rows)
    rows = max(1, min(max_rows, max_bytes // per_row))
    return [table.slice(start, rows) for start in range(0, table.num_rows, rows)]


MAX_RECORD_BATCHES = 1024  # the broker refuses a body of more (a table of many small pieces)


def ipc_body(table: pa.Table) -> bytes:
    import pyarrow as pa

    if len(table.to_batches()) > MAX_RECORD_BATCHES:
        table = table.combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def read_results(body: bytes) -> pa.Table:
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(body)).read_all()


def concat_results(answers: list[pa.Table]) -> pa.Table:
    """The answers of a send's requests as one table, in row order (an empty one for no rows)."""
    import pyarrow as pa

    if answers:
        return pa.concat_tables(answers)
    return pa.table({"partition": pa.array([], pa.int32()), "offset": pa.array([], pa.int64()),
                     "duplicate": pa.array([], pa.bool_()), "timestamp": pa.array([], pa.timestamp("us", tz="UTC"))})
