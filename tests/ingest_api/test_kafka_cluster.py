"""Kafka clients against three real `serve` nodes sharing one table root: the metadata names every
node as a broker and each partition's owner as its leader; a producer bootstrapped through one
node reaches every owner; a consumer group has one coordinator whichever node its members
bootstrap through; and, on the local S3 server, an idempotent producer at acks=all keeps its
records, once each and in order, while a node is SIGKILLed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from lakebroker.ingest_api.partitioner import partition_for_key
from lakebroker.tables import storage
from tests.servers import ServerProcess, create_topic, until

pytestmark = [pytest.mark.timeout(300)]

TTL_S = 5.0  # renewals every half TTL: room for a slow S3 commit beside the whole suite
PARTITIONS = 6


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    yield from _three(tmp_path, str(tmp_path / "tables"))


@pytest.fixture
def s3_nodes(tmp_path: Path, s3_root: str) -> Iterator[list[ServerProcess]]:
    yield from _three(tmp_path, s3_root)


def _three(tmp_path: Path, tables: str) -> Iterator[list[ServerProcess]]:
    # acks=all waits for the Delta commit: an acknowledged record outlives its node's disk
    env = {"LAKEBROKER_TABLES_URI": tables, "LAKEBROKER_INGEST_LEASE_TTL_S": str(TTL_S),
           "LAKEBROKER_INGEST_HEARTBEAT_S": "0.3", "LAKEBROKER_KAFKA_ACKS_ALL": "table",
           "LAKEBROKER_FLUSH_INTERVAL_MS": "50"}
    started = [ServerProcess(tmp_path / name, env) for name in ("a", "b", "c")]
    try:
        for node in started:
            node.start()
        create_topic(started[0], "orders", PARTITIONS)
        until(lambda: _spread(started), "the partitions on all three nodes, each with its Kafka address",
              timeout=60)
        yield started
    finally:
        for node in started:
            node.stop()


def _cluster(node: ServerProcess) -> dict[str, Any]:
    r = httpx.get(f"{node.url}/v1/cluster", timeout=10)
    assert r.status_code == 200, r.text
    cluster: dict[str, Any] = r.json()
    return cluster


def _spread(nodes: list[ServerProcess]) -> bool:
    cluster = _cluster(nodes[0])
    owners = {p["url"] for p in cluster["partitions"] if p["topic"] == "orders"}
    kafka = {n["kafka"] for n in cluster["nodes"] if n["alive"]}
    return owners == {n.url for n in nodes} and kafka == {n.kafka for n in nodes}


def _leaders(admin: AdminClient) -> dict[int, str]:
    """Each partition's leader, as host:port, from the metadata of the node `admin` bootstrapped at."""
    metadata = admin.list_topics("orders", timeout=30)
    brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    return {p.id: brokers[p.leader] for p in metadata.topics["orders"].partitions.values() if p.leader >= 0}


def test_metadata_names_every_node_and_each_partition_s_owner_as_its_leader(nodes: list[ServerProcess]) -> None:
    cluster = _cluster(nodes[1])
    kafka_of = {n["url"]: n["kafka"] for n in cluster["nodes"]}
    owners = {p["partition"]: kafka_of[p["url"]] for p in cluster["partitions"] if p["topic"] == "orders"}
    everyone = {n.kafka for n in nodes}
    for node in nodes:  # every node answers the same, once its heartbeat has seen every node's address
        admin = AdminClient({"bootstrap.servers": node.kafka})
        until(lambda admin=admin: {f"{b.host}:{b.port}" for b in admin.list_topics(timeout=30).brokers.values()}
              == everyone, f"{node.kafka} names the three brokers", timeout=30)
        # a partition whose claim is still under way has no leader yet (LEADER_NOT_AVAILABLE)
        until(lambda admin=admin: _leaders(admin) == owners, f"{node.kafka} names each owner as its leader",
              timeout=30)
        described = admin.describe_cluster().result(timeout=30)
        assert {f"{b.host}:{b.port}" for b in described.nodes} == everyone


def test_a_producer_bootstrapped_at_one_node_reaches_every_owner(nodes: list[ServerProcess]) -> None:
    producer = Producer({"bootstrap.servers": nodes[0].kafka, "enable.idempotence": True, "acks": "all",
                         "partitioner": "murmur2_random", "linger.ms": 5})
    acked: list[tuple[str, int, int]] = []
    failed: list[KafkaError] = []

    def report(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            acked.append((msg.key().decode(), msg.partition(), msg.offset()))

    for i in range(300):
        producer.produce("orders", key=f"k{i}", value=f"v{i}", on_delivery=report)
    assert producer.flush(60) == 0
    assert not failed, failed[:3]
    assert {p for _, p, _ in acked} == set(range(PARTITIONS))
    assert all(p == partition_for_key(k, PARTITIONS) for k, p, _ in acked)
    tables = str(nodes[0].data_dir.parent / "tables")
    until(lambda: len(_rows(tables)) >= 300, "the records in the table", timeout=30)
    assert sorted(r["value"] for r in _rows(tables)) == sorted(f"v{i}" for i in range(300))


def test_one_coordinator_per_group_whichever_node_its_members_bootstrap_at(nodes: list[ServerProcess]) -> None:
    producer = Producer({"bootstrap.servers": nodes[0].kafka, "partitioner": "murmur2_random"})
    for i in range(120):
        producer.produce("orders", key=f"k{i}", value=f"v{i}")
    assert producer.flush(60) == 0
    consumers = [Consumer({"bootstrap.servers": node.kafka, "group.id": "spread", "auto.offset.reset": "earliest",
                           "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
                 for node in (nodes[0], nodes[2])]
    seen: dict[int, list[str]] = {0: [], 1: []}
    try:
        for c in consumers:
            c.subscribe(["orders"])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (len(seen[0]) + len(seen[1]) < 120
                                               or not all(c.assignment() for c in consumers)):
            for i, c in enumerate(consumers):
                for msg in c.consume(100, timeout=0.2):
                    if msg.error() is None:
                        seen[i].append(msg.value().decode())
        assignments = [{tp.partition for tp in c.assignment()} for c in consumers]
        assert assignments[0] and assignments[1] and not assignments[0] & assignments[1], assignments
        assert assignments[0] | assignments[1] == set(range(PARTITIONS))
        assert sorted(seen[0] + seen[1]) == sorted(f"v{i}" for i in range(120))
        for c in consumers:
            c.commit(asynchronous=False)
        committed = consumers[0].committed([TopicPartition("orders", p) for p in range(PARTITIONS)], timeout=30)
        assert sum(tp.offset for tp in committed if tp.offset >= 0) == 120
    finally:
        for c in consumers:
            c.close()


def test_an_idempotent_producer_keeps_every_acked_record_once_and_in_order_through_a_sigkill(
        s3_nodes: list[ServerProcess], s3_root: str) -> None:
    """Records keyed to every partition, sent in order through node a, while node b is SIGKILLed:
    the client's own retries and metadata refreshes carry b's partitions to their next owners."""
    producer = Producer({"bootstrap.servers": s3_nodes[0].kafka, "enable.idempotence": True, "acks": "all",
                         "partitioner": "murmur2_random", "linger.ms": 5, "message.timeout.ms": 120_000,
                         "topic.metadata.refresh.interval.ms": 1000})
    acked: dict[str, tuple[int, int]] = {}
    failed: list[tuple[str, KafkaError]] = []

    def report(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            failed.append((msg.value().decode(), err))
        else:
            acked[msg.value().decode()] = (msg.partition(), msg.offset())

    sent = [f"r{i:05d}" for i in range(3000)]
    for i, value in enumerate(sent[:2000]):
        producer.produce("orders", key=f"k{i % 60}", value=value, on_delivery=report)
    deadline = time.monotonic() + 60
    while len(acked) < 500 and time.monotonic() < deadline:
        producer.poll(0.01)
    assert 500 <= len(acked) < 2000, len(acked)  # b dies with records of its partitions in flight
    s3_nodes[1].kill()
    for i, value in enumerate(sent[2000:], 2000):
        producer.produce("orders", key=f"k{i % 60}", value=value, on_delivery=report)
        if i % 100 == 99:
            producer.poll(0.05)  # spread over the move of b's partitions
    assert producer.flush(150) == 0
    assert not failed, failed[:3]
    assert len(acked) == len(sent)

    rows = _rows(s3_root)
    stored = [r["value"] for r in rows]
    assert len(stored) == len(set(stored)) == len(sent), "every acknowledged record once"
    where = {r["value"]: (r["partition"], r["offset"]) for r in rows}
    assert all(where[v] == acked[v] for v in sent), "each record at the offset it was acknowledged at"
    for p in range(PARTITIONS):  # the order sent, per partition, with dense offsets
        mine = sorted((r for r in rows if r["partition"] == p), key=lambda r: r["offset"])
        assert [r["offset"] for r in mine] == list(range(len(mine)))
        assert [r["value"] for r in mine] == sorted(r["value"] for r in mine), p


def _rows(tables: str) -> list[dict[str, Any]]:
    uri = storage.join(tables, "topics/orders")
    table = DeltaTable(uri, storage_options=storage.delta_options(uri)).to_pyarrow_table(
        columns=["partition", "offset", "value"])
    return [{**r, "value": r["value"].decode()} for r in table.to_pylist()]
