"""A node whose clock is off: leases are times that every node judges by its own clock, so a node
further from the table storage's clock than the leases tolerate takes no partitions, says so in
its log and in /metrics, and still serves (it forwards to the owners). Its clock is set off with
libfaketime (Debian's faketime package), the process's own clock alone: the storage's is the
machine's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import LIBFAKETIME, ServerProcess, clock_off_env, until

pytestmark = [pytest.mark.timeout(300)]



def _env(root: Path, **extra: str) -> dict[str, str]:
    return {"LAKEBROKER_TABLES_URI": str(root), "LAKEBROKER_INGEST_LEASE_TTL_S": "8",
            "LAKEBROKER_INGEST_HEARTBEAT_S": "0.3", **extra}


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    assert LIBFAKETIME, "libfaketime is installed (Debian's faketime package: .ci/run installs it)"
    root = tmp_path / "tables"
    right = ServerProcess(tmp_path / "right", _env(root))
    ahead = ServerProcess(tmp_path / "ahead", _env(root, **clock_off_env(30)))
    try:
        right.start()
        ahead.start()
        yield right, ahead
    finally:
        ahead.stop()
        right.stop()


def test_a_node_whose_clock_runs_ahead_takes_no_partitions_and_says_so(
        nodes: tuple[ServerProcess, ServerProcess]) -> None:
    right, ahead = nodes
    assert httpx.post(f"{right.url}/v1/topics", json={"name": "orders", "partitions": 4}).status_code == 201
    until(lambda: _metric(ahead.url, "lakebroker_clock_refused") == 1, "the node ahead refuses partitions")
    assert 25 < _metric(ahead.url, "lakebroker_clock_skew_seconds") < 35
    assert abs(_metric(right.url, "lakebroker_clock_skew_seconds")) < 1
    assert _metric(right.url, "lakebroker_clock_refused") == 0

    def owners() -> set[str | None]:
        cluster = httpx.get(f"{right.url}/v1/cluster", timeout=10).json()
        return {p["url"] for p in cluster["partitions"] if p["topic"] == "orders"}

    until(lambda: owners() == {right.url}, "every partition with the node whose clock is right")
    # It still serves: a produce through it reaches the owner.
    r = httpx.post(f"{ahead.url}/v1/topics/orders/messages", params={"ack": "table"},
                   json={"key": "k", "value": "v"}, timeout=30)
    assert r.status_code == 200, r.text
    assert "leases tolerate" in ahead.log.read_text()
    assert owners() == {right.url}, "and it took none since"
