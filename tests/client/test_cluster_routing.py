"""The producer against a cluster: each message straight to its partition's owner (the map from
/v1/cluster), and through the producer's URL when an owner is gone."""

from __future__ import annotations

import os
import random
import subprocess
import sys
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


def _owner(url: str, partition: int) -> str | None:
    for p in httpx.get(f"{url}/v1/cluster").json()["partitions"]:
        if p["topic"] == "orders" and p["partition"] == partition:
            return str(p["url"]) if p["url"] else None
    return None


class Recording(httpx.HTTPTransport):
    """Forwards to the nodes and keeps each /batch request's URL and answer's forwarded-to header."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[str, str | None]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith("/batch"):
            self.batches.append((f"{request.url.scheme}://{request.url.netloc.decode()}",
                                 response.headers.get("lakebroker-forwarded-to")))
        return response


def test_a_forwarded_answer_names_the_owner_and_the_producer_reads_the_map_again(
        cluster: tuple[Path, ServerProcess, ServerProcess]) -> None:
    """A partition moved since the producer read the map: its next send goes to the old owner, which
    forwards it and says to whom; the producer reads the map again at once, not in 30 s, and sends
    the partition's later messages straight to the new owner."""
    root, a, _ = cluster
    assert httpx.post(f"{a.url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
    until(lambda: _owned_by_both(a.url), "both nodes own partitions", timeout=15)
    key = "k1"
    partition = partition_for_key(key, PARTITIONS)
    transport = Recording()
    with Producer(a.url, retry=Retry(timeout_s=60), transport=transport) as producer:
        producer.send("orders", "before", key=key, ack="table").result()
        old_owner = transport.batches[-1][0]
        nodes = {n["url"]: n["id"] for n in httpx.get(f"{a.url}/v1/cluster").json()["nodes"]}
        new_owner = next(url for url in nodes if url != old_owner)
        moved = subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(a.data_dir), "cluster", "move",
                                "orders", str(partition), "--to", nodes[new_owner]], capture_output=True, text=True,
                               env={**os.environ, "LAKEBROKER_TABLES_URI": str(root)})
        assert moved.returncode == 0, moved.stderr
        until(lambda: _owner(a.url, partition) == new_owner, "the partition moved", timeout=30)

        def forwarded() -> bool:  # once the old owner has heard of the move, it forwards and says so
            r = httpx.post(f"{old_owner}/v1/topics/orders/batch", params={"ack": "table"},
                           json={"messages": [{"key": key, "value": "probe"}]})
            return r.status_code == 200 and r.headers.get("lakebroker-forwarded-to") == new_owner

        until(forwarded, "the old owner forwards", timeout=30)
        transport.batches.clear()
        producer.send("orders", "moved", key=key, ack="table").result()
        assert transport.batches == [(old_owner, new_owner)], "sent to the old owner, which forwarded it"
        producer.send("orders", "after", key=key, ack="table").result()
        assert transport.batches[-1] == (new_owner, None), "straight to the new owner"
