"""The job commands of the `lakebroker` CLI, as a person runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark_pipeline.topics import create_topic, produce, settings_for

pytestmark = pytest.mark.spark


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
