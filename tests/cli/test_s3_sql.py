"""`lakebroker sql` with the tables on a real S3 server (MinIO): topics register and query as usual."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark_pipeline.topics import create_topic, produce, settings_for

pytestmark = pytest.mark.spark


def test_sql_queries_a_topic_on_s3(tmp_path: Path, s3_root: str) -> None:
    settings = settings_for(tmp_path / "data", tables_uri=s3_root)
    create_topic(settings, "orders", partitions=2)
    produce(settings, "orders", 0, 5)
    produce(settings, "orders", 1, 3)
    done = subprocess.run(
        [sys.executable, "-m", "lakebroker", "--data-dir", str(tmp_path / "data"), "sql", "--format", "json",
         "SELECT partition, count(*) AS n, max(offset) AS top FROM orders GROUP BY partition ORDER BY partition"],
        env={**os.environ, "LAKEBROKER_TABLES_URI": s3_root}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == [{"partition": 0, "n": 5, "top": 4}, {"partition": 1, "n": 3, "top": 2}]
    assert "AWS_SECRET_ACCESS_KEY" not in done.stdout + done.stderr
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in done.stdout + done.stderr
