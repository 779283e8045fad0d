"""A node joins a busy node: one node owns a topic's eight partitions while keyed batch producers
keep every partition busy (wrk, out of process: eight connections of 1,000-message keyed JSON
batches); a second node starts and takes its share within seconds, not never, and once the move is
done every partition answers through either node."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from bench.harness.wrk import start_wrk, write_script
from tests.ingest_api.test_cluster import keys_by_partition
from tests.servers import ServerProcess, until

pytestmark = [pytest.mark.timeout(300)]

PARTITIONS = 8
LOAD_S = 60  # wrk's own bound; the test stops it once it has seen what it needs
JOIN_WITHIN_S = 30.0  # docs/cluster.md: a hand-over takes a second or two; room for a busy 2-core machine


def _env(root: Path) -> dict[str, str]:
    return {"LAKEBROKER_TABLES_URI": str(root), "LAKEBROKER_INGEST_LEASE_TTL_S": "8",
            "LAKEBROKER_INGEST_HEARTBEAT_S": "0.5"}


@pytest.fixture
def first(tmp_path: Path) -> Iterator[tuple[Path, ServerProcess]]:
    root = tmp_path / "tables"
    node = ServerProcess(tmp_path / "a", _env(root))
    try:
        node.start()
        yield root, node
    finally:
        node.stop()


def _owners(url: str) -> Counter[str]:
    cluster = httpx.get(f"{url}/v1/cluster", timeout=10).json()
    return Counter(p["url"] for p in cluster["partitions"] if p["topic"] == "busy" and p["url"])


def test_a_joining_node_gets_its_share_while_every_partition_is_busy(first: tuple[Path, ServerProcess],
                                                                     tmp_path: Path) -> None:
    root, a = first
    assert httpx.post(f"{a.url}/v1/topics", json={"name": "busy", "partitions": PARTITIONS}).status_code == 201
    body = orjson.dumps({"messages": [{"key": f"user-{i % 1000}", "value": "v" * 100} for i in range(1000)]})
    script = write_script(tmp_path, "keyed", body, "application/json")
    load = start_wrk(f"{a.url}/v1/topics/busy/batch", script, 8, LOAD_S)
    b = ServerProcess(tmp_path / "b", _env(root))
    try:
        time.sleep(3)  # the load is on before the second node comes
        b.start()
        joined = time.monotonic()
        until(lambda: _owners(a.url)[b.url] == PARTITIONS // 2, "the joining node owns half the partitions",
              timeout=JOIN_WITHIN_S)
        took = time.monotonic() - joined
        # Once moved, every partition answers through either node (forwarded where it is not the owner).
        for node in (a, b):
            for p, key in sorted(keys_by_partition(PARTITIONS).items()):
                r = httpx.post(f"{node.url}/v1/topics/busy/messages", params={"ack": "wal"},
                               json={"key": key, "value": "after"}, timeout=30)
                assert r.status_code == 200, (node.url, p, r.status_code, r.text)
                assert r.json()["partition"] == p
        assert _owners(a.url)[b.url] == PARTITIONS // 2, "and they stay"
        assert load.poll() is None, "the load was on throughout"
    finally:
        try:
            load.terminate()  # it ran longer than the test needed
            load.wait(30)
        finally:
            b.stop()
    print(f"the joining node owned its share {took:.1f} s after it started, under load")
