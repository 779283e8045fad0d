"""Three ingest nodes on the local S3 server: their tables, their ownership table and their claims
all on object storage (delta-rs's conditional puts), one of them killed."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable

from lakebroker.ingest_api.partitioner import partition_for_key
from lakebroker.tables import storage
from tests.servers import ServerProcess, until

pytestmark = [pytest.mark.timeout(300)]
PARTITIONS = 6
TTL_S = 5.0  # renewals every half TTL: room for a slow S3 commit beside the whole suite


def _owners(url: str) -> dict[int, str | None]:
    answer = httpx.get(f"{url}/v1/cluster", timeout=10).json()
    return {p["partition"]: p["url"] for p in answer["partitions"] if p["topic"] == "orders"}


def _offsets(root: str) -> dict[int, list[int]]:
    uri = storage.join(root, "topics/orders")
    rows = DeltaTable(uri, storage_options=storage.delta_options(uri)).to_pyarrow_table(
        columns=["partition", "offset"]).to_pylist()
    out: dict[int, list[int]] = {}
    for r in rows:
        out.setdefault(r["partition"], []).append(r["offset"])
    return {p: sorted(o) for p, o in out.items()}


def test_three_nodes_on_s3_share_partitions_and_survive_a_kill(tmp_path: Path, s3_root: str) -> None:
    env = {"LAKEBROKER_TABLES_URI": s3_root, "LAKEBROKER_INGEST_LEASE_TTL_S": str(TTL_S),
           "LAKEBROKER_INGEST_HEARTBEAT_S": "0.3"}
    nodes = [ServerProcess(tmp_path / name, env) for name in ("a", "b", "c")]
    try:
        for node in nodes:
            node.start()
        urls = {n.url for n in nodes}
        first = nodes[0].url
        assert httpx.post(f"{first}/v1/topics", json={"name": "orders", "partitions": PARTITIONS},
                      timeout=30).status_code == 201  # a creation waits up to 10 s for its owners

        def balanced() -> bool:
            owners = _owners(first)
            return set(owners.values()) == urls and set(Counter(owners.values()).values()) == {2}

        until(balanced, "two partitions on each node", timeout=30)
        keys = [f"k{i}" for i in range(60)]
        for node in nodes:  # the same batch through each node: forwarded to the owners, answered in order
            deadline = time.monotonic() + 15
            while True:  # a 503 while a claim is still under way is retried, as a producer does
                r = httpx.post(f"{node.url}/v1/topics/orders/batch", params={"ack": "table"}, timeout=60,
                               json={"messages": [{"key": k, "value": k, "id": f"{node.url}-{k}"} for k in keys]})
                if r.status_code != 503 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert r.status_code == 200, r.text
            assert [x["partition"] for x in r.json()["results"]] == [partition_for_key(k, PARTITIONS) for k in keys]

        dead = nodes[2]
        owners = _owners(first)  # a node whose renewal came late under load may have lost some: taken as they are
        dead.kill()
        killed = time.monotonic()
        until(lambda: set(_owners(first).values()) == urls - {dead.url}, "the survivors own everything",
              timeout=TTL_S + 20)
        took = time.monotonic() - killed
        moved = [p for p, url in owners.items() if url == dead.url]
        assert moved, owners
        for p in moved:  # as a producer does: 503 (between owners) is retried
            key = next(k for k in keys if partition_for_key(k, PARTITIONS) == p)
            answers: list[httpx.Response] = []

            def produced(key: str = key, answers: list[httpx.Response] = answers) -> bool:
                answers.append(httpx.post(f"{first}/v1/topics/orders/messages", params={"ack": "table"},
                                          json={"key": key, "value": 1}, timeout=30))
                assert answers[-1].status_code in (200, 503), answers[-1].text
                return answers[-1].status_code == 200

            until(produced, f"partition {p} served again", timeout=20)
            assert answers[-1].json()["partition"] == p
        offsets = _offsets(s3_root)
        assert sum(len(o) for o in offsets.values()) == 3 * len(keys) + len(moved)
        assert all(o == list(range(len(o))) for o in offsets.values()), "dense, nothing twice"
        print(f"partitions moved {took:.1f} s after the kill (TTL {TTL_S} s)")
    finally:
        for node in nodes:
            node.stop()
