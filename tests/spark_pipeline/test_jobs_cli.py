"""The job commands of the `lakebroker` CLI, as a person runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakebroker.tables import job_runs
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import OffsetReason, OffsetsTable
from tests.spark_pipeline.topics import (
    NOW_US,
    create_topic,
    offsets_by_partition,
    produce,
    rows,
    settings_for,
    table,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def lakebroker(data: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(data), *args],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def test_bad_input_is_one_line_and_non_zero_before_spark_starts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = settings_for(data)
    create_topic(settings, "events", partitions=1)
    cases = [
        (("compact", "nope"), "topic 'nope' does not exist"),
        (("retention", "../x"), "invalid topic name"),
        (("key-compact", "events"), "cleanup_policy=delete"),
        (("key-compact", "nope"), "topic 'nope' does not exist"),
        (("replicate",), "needs a target"),
        (("replicate", "--to", str(data / "copy")), "outside the data dir"),
        (("replicate", "--to", "s3://"), "bad replica URI"),
        (("replicate", "--to", str(tmp_path / "r"), "--topic", "nope"), "topic 'nope' does not exist"),
        (("verify-replica", "--to", "file://host/x"), "bad replica URI"),
        (("verify-replica",), "needs a target"),
    ]
    for args, needle in cases:
        result = lakebroker(data, *args, timeout=60)
        assert result.returncode != 0, args
        assert "Traceback" not in result.stderr, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and needle in errors[0], (args, result.stderr[-800:])


def test_compact_records_the_run_and_verify_replica_fails_on_a_missing_replica(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = settings_for(data)
    create_topic(settings, "events", partitions=1)
    for _ in range(4):
        produce(settings, "events", 0, 5)
    env_free = lakebroker(data, "compact", "events")
    assert env_free.returncode == 0, env_free.stderr[-2000:]
    assert "compaction run" in env_free.stdout and "4 → 1" in env_free.stdout
    runs = lakebroker(data, "job-runs")
    assert runs.returncode == 0 and "compaction" in runs.stdout and "events" in runs.stdout and "cli" in runs.stdout
    missing = lakebroker(data, "verify-replica", "--to", str(tmp_path / "never"))
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "no replica table" in missing.stderr


def _printed_rows(stdout: str) -> list[list[str]]:
    """The body rows of a table `lakebroker sql` printed (rich: header cells between ┃, body cells between │)."""
    return [[cell.strip() for cell in line.strip().strip("│").split("│")]
            for line in stdout.splitlines() if line.strip().startswith("│")]


@pytest.mark.timeout(1200)  # a long chain of Spark jobs: minutes when the suite runs in parallel
def test_retention_key_compact_compact_offsets_and_time_travel_from_the_cli(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = settings_for(data)
    layout = Layout(data)
    old = NOW_US() - 2 * 3_600_000_000
    create_topic(settings, "events", partitions=1, retention_ms=3_600_000)
    produce(settings, "events", 0, 10, ts_us=old)  # offsets 0-9, expired
    time.sleep(1.2)
    between = datetime.now(UTC)  # after that commit, before the next
    time.sleep(1.2)
    produce(settings, "events", 0, 10, ts_us=old)  # 10-19, expired
    produce(settings, "events", 0, 10)  # 20-29, fresh
    before_retention = table(settings, "events").version()
    create_topic(settings, "users", partitions=1, cleanup_policy="compact")
    produce(settings, "users", 0, 5, ts_us=old, keys=["a", "b", "a", "b", "c"],
            values=[b"a0", b"b1", b"a2", b"b3", b"c4"])
    offsets = OffsetsTable(layout)
    for n in range(3):
        offsets.commit("current", "events", {0: 25 + n}, OffsetReason.ACK)
    offsets.commit("lagging", "events", {0: 4}, OffsetReason.ACK)

    done = lakebroker(data, "retention", "events")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "retention run" in done.stdout and "3 → 1" in done.stdout
    assert offsets_by_partition(settings, "events") == {0: list(range(20, 30))}
    assert offsets.latest()[("lagging", "events", 0)] == (20, OffsetReason.RETENTION_SKIP.value)

    done = lakebroker(data, "key-compact", "users")
    assert done.returncode == 0, done.stderr[-2000:]
    assert {(r["key"], r["offset"]) for r in rows(settings, "users", ["key", "offset"])} == {
        ("a", 2), ("b", 3), ("c", 4)}

    positions = offsets.latest()
    done = lakebroker(data, "compact-offsets")
    assert done.returncode == 0, done.stderr[-2000:]
    left = DeltaTable(layout.offsets_table).to_pyarrow_table(columns=["group", "topic", "partition"]).to_pylist()
    assert sorted((r["group"], r["topic"], r["partition"]) for r in left) == sorted(positions)  # one row each
    assert offsets.latest() == positions

    runs = job_runs.last_runs(layout)
    assert {(r["job"], r["target"], r["trigger"], r["outcome"]) for r in runs} == {
        ("retention", "events", "cli", "ok"), ("key-compaction", "users", "cli", "ok"),
        ("offsets-compaction", "_system/consumer_offsets", "cli", "ok")}

    # Time travel sees what retention removed (its files outlive it by vacuum_retention_hours), by
    # version and by timestamp (the session's time zone is UTC), in one `sql` run.
    query = "SELECT '{0}' AS asof, count(*) AS n, min(offset) AS lo, max(offset) AS hi FROM events {0} AS OF {1}"
    at = between.strftime("'%Y-%m-%d %H:%M:%S.%f'")
    both = " UNION ALL ".join([query.format("VERSION", before_retention), query.format("TIMESTAMP", at)])
    travelled = lakebroker(data, "sql", f"{both} ORDER BY asof")
    assert travelled.returncode == 0, travelled.stderr[-2000:]
    assert _printed_rows(travelled.stdout) == [["TIMESTAMP", "10", "0", "9"], ["VERSION", "30", "0", "29"]], \
        travelled.stdout
