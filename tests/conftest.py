from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ingest_api import create_app
from tables.settings import Settings
from tests.s3 import s3_root, s3_server, s3_spark  # noqa: F401 - fixtures: one MinIO per test process


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Delivery on the test's own event loop: tests read the worker's live state (app.state.delivery).
    return Settings(data_dir=tmp_path / "data", flush_interval_ms=20, allow_private_webhooks=True, heartbeat_s=0.5,
                    offset_commit_interval_ms=200, delivery_mode="inprocess")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def orders(client: TestClient) -> str:
    r = client.post("/v1/topics", json={"name": "orders", "partitions": 3})
    assert r.status_code == 201, r.text
    return "orders"


# The longest modules, longest first, from a full run's --durations (scripts/test.sh, 4 processes).
LONGEST_FIRST = (
    "tests/spark_pipeline/test_replication.py",
    "tests/spark_pipeline/test_replication_fault.py",
    "tests/bench/test_soak.py",
    "tests/tables/test_table_features.py",
    "tests/airflow_dags/test_dags.py",
    "tests/spark_pipeline/test_jobs_cli.py",
    "tests/cli/test_sql_cli.py",
    "tests/spark_pipeline/test_compaction.py",
    "tests/cli/test_quickstart.py",
    "tests/spark_pipeline/test_s3.py",
    "tests/spark_pipeline/test_retention.py",
    "tests/spark_pipeline/test_cluster.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules run first, then the rest of those with a test marked `slow`: in parallel
    processes (scripts/test.sh) the suite then ends with short modules filling in, not with one
    long Spark chain started last."""
    root = Path(__file__).resolve().parent.parent
    rank = {root / path: i for i, path in enumerate(LONGEST_FIRST)}
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    # stable: the order within each group stays
    items.sort(key=lambda item: (rank.get(item.path, len(rank)), item.path not in slow))
