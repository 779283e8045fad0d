"""How the tables' Parquet files are laid out: row groups a reader can skip, and how the offset
column is encoded.

Row groups. A reader skips a row group whose offset statistics miss the range it asks for
(pyarrow prunes before decoding), but never part of one: a delivery read of 1,000 offsets decodes
every row group that holds any of them. Spark's default row group is 128 MB (`parquet.block.size`),
so a compacted file was one row group, and reading 1,000 rows from the middle of it decoded the
whole file.

4 MiB keeps such a read to at most two row groups of a few thousand rows each: a few milliseconds,
which smaller groups barely improve on, while each group costs footer metadata that every open
parses (~1.5 KB; 32 groups in a 128 MB file). Scans of whole files are as fast either way
(`python -m bench.run --only read_amplification`, docs/benchmarks.md).

The two writers measure differently. Spark (spark_pipeline/session.py) counts a row group's
encoded, compressed bytes, so one may decode to more where values compress; delta-rs bounds rows
only, so `writer_properties` turns the bound into rows at the batch's average Arrow (decoded) size.

Offsets. A flush file holds each partition's offsets dense and ascending, which Parquet's
DELTA_BINARY_PACKED stores in a few bits per page. Its default, a dictionary, suits them worst:
every value is new, so the writer hashes each one until the dictionary is full and then falls
back to plain 8-byte values. delta-rs spent about a sixth of a flush's CPU on that, and the column
was most of a file of small messages. Every reader of the tables decodes it (pyarrow, delta-rs,
Spark's vectorized reader); the statistics that prune row groups are kept as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import WriterProperties

ROW_GROUP_BYTES = 4 * 1024 * 1024
OFFSET_COLUMN = "offset"  # in topic tables; a table without it is written as before


def writer_properties(data: pa.Table) -> WriterProperties:
    """delta-rs's Parquet settings for writing `data`: its defaults (Snappy), with row groups of
    about ROW_GROUP_BYTES of decoded rows and the offset column delta-encoded."""
    from deltalake import ColumnProperties, WriterProperties

    rows = max(1, ROW_GROUP_BYTES * data.num_rows // max(1, data.nbytes))
    # Given any properties, delta-rs drops its own default compression: Snappy is restated here.
    return WriterProperties(compression="SNAPPY", max_row_group_size=rows, column_properties={
        OFFSET_COLUMN: ColumnProperties(dictionary_enabled=False, encoding="DELTA_BINARY_PACKED"),
    })
