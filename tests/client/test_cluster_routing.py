"""The producer against a cluster: each message straight to its partition's owner (the map from
/v1/cluster), and through the producer's URL when an owner is gone."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable

from lakebroker.ingest_api.partitioner import partition_for_key
from lakebroker_client import Producer, Retry
from lakebroker_client._routing import partition_of
from tests.servers import ServerProcess, until

pytestmark = [pytest.mark.timeout(300)]
PARTITIONS = 4


def test_the_client_picks_partitions_as_the_broker_does() -> None:
    rng = random.Random(7)
    alphabet = "abcxyz0123456789-_é日本🙂"
    routes = ["", "a", "m:abc", "p:prod:17"] + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
                                              for _ in range(2000)]
    for n in (1, 3, 4, 7, 1024):
        assert [partition_of(r, n) for r in routes] == [partition_for_key(r, n) for r in routes]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, ServerProcess, ServerProcess]]:
    root = tmp_path / "tables"
    env = {"LAKEBROKER_TABLES_URI": str(root), "LAKEBROKER_INGEST_LEASE_TTL_S": "3",
           "LAKEBROKER_INGEST_HEARTBEAT_S": "0.2"}
    a, b = ServerProcess(tmp_path / "a", env), ServerProcess(tmp_path / "b", env)
    try:
        a.start()
        b.start()
        yield root, a, b
    finally:
        a.stop()
        b.stop()


def _owned_by_both(url: str) -> bool:
    owners = [p["url"] for p in httpx.get(f"{url}/v1/cluster").json()["partitions"] if p["topic"] == "orders"]
    return len(owners) == PARTITIONS and len(set(owners)) == 2 and None not in owners


def test_the_producer_sends_to_owners_and_survives_a_dead_owner(
        cluster: tuple[Path, ServerProcess, ServerProcess]) -> None:
    root, a, b = cluster
    assert httpx.post(f"{a.url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
    until(lambda: _owned_by_both(a.url), "both nodes own partitions", timeout=15)
    with Producer(a.url, retry=Retry(timeout_s=60)) as producer:
        keyed = [producer.send("orders", {"i": i}, key=f"k{i}", ack="table") for i in range(200)]
        keyless = [producer.send("orders", {"i": i}, ack="table") for i in range(200)]
        producer.flush()
        results = [f.result() for f in keyed + keyless]
        assert [r.partition for r in results[:200]] == [partition_for_key(f"k{i}", PARTITIONS) for i in range(200)]
        assert producer.stats().routed >= 2, "requests went straight to both owners"
        b.kill()  # b's partitions move to a; the producer's sends to b fail and go through a
        late = [producer.send("orders", {"late": i}, key=f"k{i}", ack="table") for i in range(40)]
        producer.flush()
        assert all(f.result().offset is not None for f in late)
        assert producer.stats().failed == 0
    rows = DeltaTable(str(root / "topics" / "orders")).to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
    assert len(rows) == 440
    by_partition: dict[int, list[int]] = {}
    for r in rows:
        by_partition.setdefault(r["partition"], []).append(r["offset"])
    assert all(sorted(o) == list(range(len(o))) for o in by_partition.values()), "dense, nothing twice"
