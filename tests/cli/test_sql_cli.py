"""`lakebroker sql` as a person or a script runs it: short errors, no JVM chatter, CSV and JSON output.

Each run starts a JVM, so this module runs the command only four times.
"""

from __future__ import annotations

import base64
import csv
import io
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.spark_pipeline.topics import create_topic, produce, settings_for

pytestmark = [pytest.mark.spark]

# What a driver JVM prints to a terminal as it starts, and what pyspark logs when a query fails.
CHATTER = ("WARNING", "log4j", "Setting default log level", "setLogLevel", "WARN ", "ivy", "SPARK_LOCAL_IP",
           '"level"', "JVM stacktrace", "at org.apache")


def lakebroker_sql(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "sql", *args],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})


def assert_no_chatter(stderr: str) -> None:
    for needle in CHATTER:
        assert needle not in stderr, (needle, stderr[:2000])


def test_errors_are_short_the_stack_is_verbose_and_scripts_get_csv_and_json(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = settings_for(data)
    create_topic(settings, "orders", partitions=2)
    produce(settings, "orders", 0, 3, keys=["a", "b", None], values=[b"v0", b"\x00\xff", None])
    produce(settings, "orders", 1, 1, keys=["c"], values=[b"v3"])

    bad = lakebroker_sql(data, "SELECT nope FROM missing_table")
    assert bad.returncode == 1
    assert len(bad.stdout.encode()) + len(bad.stderr.encode()) < 1000, bad.stdout + bad.stderr
    assert bad.stdout == ""
    lines = bad.stderr.strip().splitlines()
    assert len(lines) <= 2 and lines[0].startswith("error: query failed: [TABLE_OR_VIEW_NOT_FOUND]"), bad.stderr
    assert_no_chatter(bad.stderr)
    assert "Setting default log level" in (data / "_jobs" / "cli-sql.log").read_text()  # kept, off the terminal

    verbose = lakebroker_sql(data, "--verbose", "SELECT nope FROM missing_table")
    assert verbose.returncode == 1 and verbose.stderr.startswith("error: query failed: [TABLE_OR_VIEW_NOT_FOUND]")
    assert "JVM stacktrace:" in verbose.stderr and "at org.apache.spark.sql" in verbose.stderr
    assert "WARNING: Using incubator modules" not in verbose.stderr  # the stack, still no start-up chatter

    query = ("SELECT partition, offset, key, value, timestamp, map('h', 1) AS m "
             "FROM orders ORDER BY partition, offset")
    as_json = lakebroker_sql(data, "--format", "json", query)
    assert as_json.returncode == 0, as_json.stderr[-2000:]
    assert as_json.stderr == ""  # not a line of JVM or Spark start-up chatter on a successful query
    records = orjson.loads(as_json.stdout)
    assert [(r["partition"], r["offset"], r["key"]) for r in records] == [
        (0, 0, "a"), (0, 1, "b"), (0, 2, None), (1, 0, "c")]
    assert [None if r["value"] is None else base64.b64decode(r["value"]) for r in records] == [
        b"v0", b"\x00\xff", None, b"v3"]
    assert all(r["m"] == {"h": 1} and "T" in r["timestamp"] for r in records)

    as_csv = lakebroker_sql(data, "-f", "csv", query)
    assert as_csv.returncode == 0 and as_csv.stderr == "", as_csv.stderr[-2000:]
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [(r["partition"], r["offset"], r["key"], r["value"], r["m"]) for r in rows] == [
        ("0", "0", "a", base64.b64encode(b"v0").decode(), '{"h":1}'),
        ("0", "1", "b", base64.b64encode(b"\x00\xff").decode(), '{"h":1}'),
        ("0", "2", "", "", '{"h":1}'),
        ("1", "0", "c", base64.b64encode(b"v3").decode(), '{"h":1}')]
