"""After every Spark job, topic tables stay writable and readable by delta-rs, and keep their log ends.

delta-rs cannot write tables with deletion vectors, row tracking, in-commit timestamps, clustering
or domain metadata; the ingest tier relies on the `lakebroker.partition.{p}` txn versions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakebroker.spark_pipeline.jobs import compaction, key_compaction, offsets_compaction, replication, retention
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import OffsetReason, OffsetsTable
from lakebroker.tables.schemas import FORBIDDEN_WRITER_FEATURES
from tests.spark_pipeline.topics import NOW_US, create_topic, log_ends, produce, settings_for

pytestmark = pytest.mark.spark


def assert_delta_rs_compatible(uri: str, ends: dict[int, int | None] | None = None) -> None:
    table = DeltaTable(uri)
    protocol = table.protocol()
    assert protocol.min_reader_version == 1, protocol
    features = set(protocol.writer_features or [])
    assert protocol.min_writer_version == 2 or not features & FORBIDDEN_WRITER_FEATURES, protocol
    assert not features & FORBIDDEN_WRITER_FEATURES, protocol
    assert not (protocol.reader_features or []), protocol
    table.to_pyarrow_table()  # the pyarrow reader (which rejects deletion vectors) can read it
    if ends is not None:
        assert {p: table.transaction_version(delta.partition_app_id(p)) for p in ends} == ends


@pytest.mark.timeout(1200)  # every job in turn: over 600 s beside the whole suite
def test_every_job_leaves_topic_tables_writable_by_delta_rs(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data", retention_trim_partial_files=True, key_compaction_min_lag_ms=0,
                            compaction_target_file_bytes=1_000_000)
    layout = Layout(settings.data_dir)
    create_topic(settings, "events", partitions=2, retention_ms=3_600_000)
    create_topic(settings, "state", partitions=1, cleanup_policy="compact", tombstone_retention_ms=0)
    old = NOW_US() - 2 * 3_600_000_000
    for i in range(6):
        produce(settings, "events", i % 2, 10, ts_us=old if i < 2 else NOW_US())
    produce(settings, "events", 0, 10, ts_us=[old] * 5 + [NOW_US()] * 5)  # a file to trim
    produce(settings, "state", 0, 6, keys=["a", "b", "a", "b", "c", "a"], values=[b"1", b"2", b"3", None, b"5", b"6"])
    OffsetsTable(layout).commit("g", "events", {0: 0, 1: 0}, OffsetReason.ACK)
    OffsetsTable(layout).commit("g", "events", {0: 1}, OffsetReason.ACK)
    events, state = layout.topic_table("events"), layout.topic_table("state")
    replica = tmp_path / "replica"

    steps = [
        ("compaction", lambda: compaction.run(spark, settings)),
        ("retention", lambda: retention.run(spark, settings)),
        ("key compaction", lambda: key_compaction.run(spark, settings)),
        ("offsets compaction", lambda: offsets_compaction.run(spark, settings)),
        ("replication", lambda: replication.run(spark, settings, to=str(replica))),
    ]
    for name, step in steps:
        ends = {"events": log_ends(settings, "events", 2), "state": log_ends(settings, "state", 1)}
        result = step()
        assert result.outcome.value == "ok", (name, result.public())
        assert_delta_rs_compatible(events, ends["events"])
        assert_delta_rs_compatible(state, ends["state"])
        # The flusher can still append (and the next append sees its log end).
        start, _end = produce(settings, "events", 1, 3)
        assert start == ends["events"][1]
        produce(settings, "state", 0, 1, keys=["z"])
    assert_delta_rs_compatible(layout.offsets_table)
    OffsetsTable(layout).commit("g", "events", {1: 5}, OffsetReason.ACK)  # delta-rs appends still work
    for table in ("topics/events", "topics/state", "_system/consumer_offsets", "_system/topics"):
        assert_delta_rs_compatible(str(replica / table))
    # A replica can be promoted: delta-rs appends to it as the flusher would.
    promoted = DeltaTable(str(replica / "topics" / "events"))
    before = promoted.to_pyarrow_table().num_rows
    rows = DeltaTable(events).to_pyarrow_table().slice(0, 1)
    delta.append(promoted, rows, txns={delta.partition_app_id(0): 10_000})
    assert DeltaTable(str(replica / "topics" / "events")).to_pyarrow_table().num_rows == before + 1
    assert isinstance(rows, pa.Table)
