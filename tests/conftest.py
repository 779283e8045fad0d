from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lakebroker.server import build_app
from lakebroker.tables.settings import Settings
from tests.s3 import s3_root, s3_server, s3_spark  # noqa: F401 - fixtures: one MinIO per test process

# Every `lakebroker serve` a test starts (tests/servers.py, the guides' and the wheel's commands) has
# a Kafka listener: on any free port, since several servers run at once.
os.environ.setdefault("LAKEBROKER_KAFKA_PORT", "0")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Delivery on the test's own event loop: tests read the worker's live state (app.state.live_status).
    return Settings(data_dir=tmp_path / "data", flush_interval_ms=20, allow_private_webhooks=True, heartbeat_s=0.5,
                    offset_commit_interval_ms=200, delivery_mode="inprocess")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(build_app(settings)) as c:
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
    "tests/test_wheel.py",
    "tests/spark_pipeline/test_jobs_cli.py",
    "tests/cli/test_sql_cli.py",
    "tests/spark_pipeline/test_compaction.py",
    "tests/cli/test_quickstart.py",
    "tests/spark_pipeline/test_s3.py",
    "tests/spark_pipeline/test_retention.py",
    "tests/spark_pipeline/test_cluster.py",
)


# The modules that use the shared in-process Spark session (tests/spark_fixtures.py), in two groups:
# each group runs in one test process, so the run starts two session JVMs, not one per process.
# A JVM's start, warm-up and JIT cost about 70 CPU-s (measured: test_key_compaction and
# test_retention, 117 + 130 CPU-s in two processes, 173 in one). Two groups, not one: a single
# group would be one chain of about 15 minutes beside the rest of the suite.
SPARK_SESSION_GROUPS = {
    "spark-session-a": ("tests/spark_pipeline/test_replication.py", "tests/spark_pipeline/test_analysts.py",
                        "tests/spark_pipeline/test_key_compaction.py", "tests/spark_pipeline/test_retention.py",
                        "tests/ingest_api/test_subscription_status.py"),
    "spark-session-b": ("tests/tables/test_table_features.py", "tests/spark_pipeline/test_s3.py",
                        "tests/spark_pipeline/test_session.py", "tests/spark_pipeline/test_compaction.py",
                        "tests/cli/test_job_progress.py", "tests/spark_pipeline/test_topic_reads.py",
                        "tests/spark_pipeline/test_topic_writes.py", "tests/spark_pipeline/test_topic_streams.py",
                        "tests/spark_pipeline/test_spark_kafka.py"),
}
_GROUP_OF = {module: group for group, modules in SPARK_SESSION_GROUPS.items() for module in modules}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (scripts/test.sh), except that each group above is one unit of work."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SessionGroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return _GROUP_OF.get(module, module)

    return SessionGroupScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules run first, then the rest of those with a test marked `slow`: in parallel
    processes (scripts/test.sh) the suite then ends with short modules filling in, not with one
    long Spark chain started last."""
    root = Path(__file__).resolve().parent.parent
    ungrouped = sorted({str(item.path.relative_to(root)) for item in items if "spark" in item.fixturenames}
                       - _GROUP_OF.keys())
    if ungrouped:  # else it would start a session JVM of its own in whichever process runs it
        raise pytest.UsageError(f"add {', '.join(ungrouped)} to SPARK_SESSION_GROUPS in tests/conftest.py")
    rank = {root / path: i for i, path in enumerate(LONGEST_FIRST)}
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    # stable: the order within each group stays
    items.sort(key=lambda item: (rank.get(item.path, len(rank)), item.path not in slow))
