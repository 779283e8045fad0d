"""A subscription's status shows the retention job's durable record of messages it skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lakebroker.spark_pipeline.jobs import retention
from lakebroker.tables.job_runs import Outcome
from lakebroker.tables.settings import Settings
from tests.spark_fixtures import spark

__all__ = ["spark"]


@pytest.mark.spark
def test_status_shows_the_messages_retention_skipped(spark: Any, client: TestClient, settings: Settings) -> None:
    r = client.post("/v1/topics", json={"name": "events", "partitions": 2, "retention_ms": 3_600_000})
    assert r.status_code == 201, r.text
    # Nothing listens on port 9; paused as well, so the group stays at offset 0 however the worker runs.
    r = client.post("/v1/subscriptions", json={"name": "hooks", "topic": "events", "url": "http://127.0.0.1:9/",
                                               "start": "earliest"})
    assert r.status_code == 201, r.text
    assert client.post("/v1/subscriptions/hooks/pause").status_code == 200
    for i in range(7):
        r = client.post("/v1/topics/events/messages?ack=table", json={"value": f"m{i}", "partition": 0})
        assert r.status_code == 200, r.text
    before = client.get("/v1/subscriptions/hooks").json()["partitions"]
    assert [p["lag"] for p in before] == [7, 0]
    assert before[0]["retention_skips"] == {"skips": 0, "messages": 0, "last": None}

    # Two hours on, every message is past retention_ms: the partition empties and the group moves.
    result = retention.run(spark, settings, "events", now=datetime.now(UTC) + timedelta(hours=2))
    assert result.outcome is Outcome.OK, result.public()
    assert result.table("events").rows_removed == 7

    status = client.get("/v1/subscriptions/hooks")
    assert status.status_code == 200, status.text
    p0, p1 = status.json()["partitions"]
    assert p0["committed_offset"] == p0["high_watermark"] == 7 and p0["lag"] == 0
    assert p0["last_commit_reason"] == "retention-skip"
    last = p0["retention_skips"]["last"]
    assert p0["retention_skips"] == {"skips": 1, "messages": 7, "last": {
        "skipped_at": last["skipped_at"], "from_offset": 0, "to_offset": 7, "messages": 7,
        "run_id": result.run_id}}
    assert abs(datetime.fromisoformat(last["skipped_at"]) - datetime.now(UTC)) < timedelta(minutes=5)
    assert p1["retention_skips"] == {"skips": 0, "messages": 0, "last": None}  # nothing to skip there

    # A new subscription of the same name does not inherit the old group's skips.
    assert client.delete("/v1/subscriptions/hooks").status_code == 204
    r = client.post("/v1/subscriptions", json={"name": "hooks", "topic": "events", "url": "http://127.0.0.1:9/"})
    assert r.status_code == 201, r.text
    again = client.get("/v1/subscriptions/hooks").json()["partitions"]
    assert again[0]["retention_skips"] == {"skips": 0, "messages": 0, "last": None}


def test_the_status_reads_the_skips_without_pyspark() -> None:
    """The API reads the skips through tables/ (delta-rs): serving the status starts no JVM."""
    code = """
import json, pathlib, sys, tempfile
from datetime import UTC, datetime, timedelta
from fastapi.testclient import TestClient
from lakebroker.server import build_app
from lakebroker.tables.layout import Layout
from lakebroker.tables.retention_skips import RetentionSkip, record_skips
from lakebroker.tables.settings import Settings

data = pathlib.Path(tempfile.mkdtemp()) / "data"
settings = Settings(data_dir=data, deliver_in_serve=False, allow_private_webhooks=True)
with TestClient(build_app(settings)) as c:
    assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
    sub = {"name": "s", "topic": "t", "url": "http://127.0.0.1:9/"}
    assert c.post("/v1/subscriptions", json=sub).status_code == 201
    at = datetime.now(UTC)
    record_skips(Layout(data), [RetentionSkip("s", "t", 0, 2, 5, at, "r1"),
                                RetentionSkip("s", "t", 0, 5, 9, at + timedelta(seconds=1), "r2"),
                                RetentionSkip("other", "t", 0, 0, 9, at, "r2")])
    r = c.get("/v1/subscriptions/s")
    assert r.status_code == 200, r.text
    print(json.dumps(r.json()["partitions"][0]["retention_skips"]))
print(sorted(m for m in ("pyspark", "py4j") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    skips, modules = done.stdout.strip().splitlines()[-2:]
    assert modules == "[]"
    shown = json.loads(skips)
    assert (shown["skips"], shown["messages"]) == (2, 7)
    assert (shown["last"]["from_offset"], shown["last"]["to_offset"], shown["last"]["run_id"]) == (5, 9, "r2")
