"""Any node answers for every partition: three real `lakebroker serve` processes on one table root,
each partition owned by one of them, and every read route asked through every node.

A pull consumer, a dashboard or a subscription's status sits behind a load balancer: a node that
does not own a partition must still read its messages and report its ends as the table holds
them, never an empty partition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable

from tests.ingest_api.test_cluster import keys_by_partition
from tests.receivers import Receiver
from tests.servers import ServerProcess, until

pytestmark = [pytest.mark.timeout(300)]

PARTITIONS = 3


def _env(root: Path) -> dict[str, str]:
    return {"LAKEBROKER_TABLES_URI": str(root), "LAKEBROKER_INGEST_LEASE_TTL_S": "6",
            "LAKEBROKER_INGEST_HEARTBEAT_S": "0.3", "LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1"}


KEYS = keys_by_partition(PARTITIONS)


@pytest.fixture
def three(tmp_path: Path) -> Iterator[tuple[Path, list[ServerProcess]]]:
    root = tmp_path / "tables"
    nodes = [ServerProcess(tmp_path / name, _env(root)) for name in "abc"]
    try:
        for node in nodes:
            node.start()
        yield root, nodes
    finally:
        for node in nodes:
            node.stop()


def _owners(url: str) -> dict[int, str | None]:
    cluster = httpx.get(f"{url}/v1/cluster", timeout=10).json()
    return {p["partition"]: p["url"] for p in cluster["partitions"] if p["topic"] == "r"}


def _table(root: Path) -> dict[int, list[dict[str, Any]]]:
    rows = DeltaTable(str(root / "topics" / "r")).to_pyarrow_table(columns=["partition", "offset", "key"]).to_pylist()
    out: dict[int, list[dict[str, Any]]] = {p: [] for p in range(PARTITIONS)}
    for row in rows:
        out[row["partition"]].append(row)
    return {p: sorted(r, key=lambda row: row["offset"]) for p, r in out.items()}


def test_every_read_route_through_every_node_agrees_with_the_table(three: tuple[Path, list[ServerProcess]]) -> None:
    root, nodes = three
    first = nodes[0].url
    assert httpx.post(f"{first}/v1/topics", json={"name": "r", "partitions": PARTITIONS}).status_code == 201
    until(lambda: all(httpx.get(f"{n.url}/v1/topics/r").status_code == 200 for n in nodes), "every node sees r")
    urls = {n.url for n in nodes}
    until(lambda: set(_owners(first).values()) == urls, "one partition per node", timeout=30)
    owners = _owners(first)

    receiver = Receiver()
    try:
        r = httpx.post(f"{first}/v1/subscriptions", timeout=30,
                       json={"name": "hook", "topic": "r", "url": receiver.url, "start": "earliest"})
        assert r.status_code == 201, r.text
        # Partition p gets p + 2 messages, each produced through the owner (no forward), at ack=table.
        for p in range(PARTITIONS):
            for n in range(p + 2):
                r = httpx.post(f"{owners[p]}/v1/topics/r/messages", params={"ack": "table"},
                               json={"key": KEYS[p], "value": {"p": p, "n": n}}, timeout=30)
                assert r.status_code == 200 and r.json()["partition"] == p, r.text
        stored = _table(root)
        assert {p: len(rows) for p, rows in stored.items()} == {p: p + 2 for p in range(PARTITIONS)}

        for node in nodes:
            described = httpx.get(f"{node.url}/v1/topics/r", timeout=10).json()["partition_offsets"]
            for part in described:
                p = part["partition"]
                assert (part["high_watermark"], part["log_end_offset"]) == (p + 2, p + 2), (node.url, part)
                assert part["committed_offset"] == part["high_watermark"], part  # the deprecated name
            for p in range(PARTITIONS):
                expected = [row["offset"] for row in stored[p]]
                for query in ({"offset": 0}, {"timestamp": 0}, {}):
                    read = httpx.get(f"{node.url}/v1/topics/r/partitions/{p}/messages", params=query,
                                     timeout=10).json()
                    assert [m["offset"] for m in read["messages"]] == expected, (node.url, p, query, read)
                    assert read["next_offset"] == read["high_watermark"] == read["committed_offset"] == p + 2, (
                        node.url, p, query, read)
            # A pull group's position, committed through one node, bounded by the end this node reports.
            r = httpx.post(f"{node.url}/v1/topics/r/groups/pull/offsets", json={"offsets": {"2": 4}}, timeout=30)
            assert r.status_code == 200, (node.url, r.text)

        receiver.wait_for(lambda: len(receiver.received) >= sum(p + 2 for p in range(PARTITIONS)))
        for node in nodes:
            status = httpx.get(f"{node.url}/v1/subscriptions/hook", timeout=10).json()
            ends = {part["partition"]: part["high_watermark"] for part in status["partitions"]}
            assert all(part["log_end_offset"] == part["high_watermark"] for part in status["partitions"]), status
            assert ends == {p: p + 2 for p in range(PARTITIONS)}, (node.url, status)
            # Seeking to latest puts every partition at its end, whichever node is asked.
            r = httpx.post(f"{node.url}/v1/subscriptions/hook/seek", json={"to": "latest"}, timeout=30)
            assert r.status_code == 200, (node.url, r.text)
            assert {int(p): o for p, o in r.json()["offsets"].items()} == {p: p + 2 for p in range(PARTITIONS)}
    finally:
        receiver.close()
