"""Kafka consumer groups through the Kafka listener: librdkafka consumers share a topic's partitions
and rebalance when one joins; committed offsets land in the offsets table (seen over HTTP) and a
group resumes from them after a broker restart; kafka-python's admin client lists and describes
groups; a member that stops heartbeating is dropped when its session runs out."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, Producer
from kafka import KafkaAdminClient
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.sync_group.v5.request import SyncGroupRequest, SyncGroupRequestAssignment

from tests.kafka_wire import KafkaConnection
from tests.servers import ServerProcess, create_topic, free_port, serving, until

pytestmark = [pytest.mark.timeout(300)]

PARTITIONS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("kafka-groups") / "data", {"LAKEBROKER_FLUSH_INTERVAL_MS": "50"}) as node:
        yield node


def _produce(server: ServerProcess, topic: str, first: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": server.kafka, "partitioner": "murmur2_random", "acks": "all"})
    for i in range(first, first + count):
        producer.produce(topic, key=f"k{i}", value=f"v{i}".encode())
    assert producer.flush(60) == 0


def _consumer(server: ServerProcess, group: str, **extra: object) -> Consumer:
    return Consumer({"bootstrap.servers": server.kafka, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 10_000, **extra})


def _drain(consumer: Consumer, until_s: float, into: dict[str, str], name: str) -> None:
    """Consume for `until_s`, committing after each batch read (a commit is a Delta commit)."""
    deadline = time.monotonic() + until_s
    while time.monotonic() < deadline:
        batch = consumer.consume(500, 0.3)
        for m in batch:
            assert m.error() is None, m.error()
            into[m.value().decode()] = name
        if batch:
            consumer.commit(asynchronous=False)


def test_two_consumers_share_the_partitions_and_rebalance(server: ServerProcess) -> None:
    create_topic(server, "shared", PARTITIONS)
    _produce(server, "shared", 0, 400)
    seen: dict[str, str] = {}
    a = _consumer(server, "g-shared")
    a.subscribe(["shared"])
    _drain(a, 5, seen, "a")
    assert len(seen) == 400 and len(a.assignment()) == PARTITIONS  # alone, it has every partition
    b = _consumer(server, "g-shared")
    b.subscribe(["shared"])
    stop = threading.Event()

    def keep_polling() -> None:  # `a` must poll to take part in the rebalance
        while not stop.is_set():
            batch = a.consume(100, 0.2)
            for m in batch:
                assert m.error() is None, m.error()
                seen[m.value().decode()] = "a"
            if batch:
                a.commit(asynchronous=False)

    poller = threading.Thread(target=keep_polling)
    poller.start()
    try:
        def b_assigned() -> bool:  # `b` polls to join; what it reads meanwhile counts
            for m in b.consume(100, 0.3):
                assert m.error() is None, m.error()
                seen[m.value().decode()] = "b"
            return len(b.assignment()) > 0

        until(b_assigned, "b is assigned partitions", timeout=60)
        _produce(server, "shared", 400, 400)
        _drain(b, 8, seen, "b")
    finally:
        stop.set()
        poller.join()
    owned_a = {tp.partition for tp in a.assignment()}
    owned_b = {tp.partition for tp in b.assignment()}
    assert owned_a and owned_b and owned_a.isdisjoint(owned_b) and owned_a | owned_b == set(range(PARTITIONS))
    assert set(seen) == {f"v{i}" for i in range(800)}
    assert {seen[f"v{i}"] for i in range(400, 800)} == {"a", "b"}  # the second half went to both
    committed = httpx.get(f"{server.url}/v1/topics/shared/groups/g-shared/offsets", timeout=30).json()["offsets"]
    assert sum(committed.values()) == 800  # the same offsets table as every group
    a.close()
    b.close()


def test_a_group_resumes_from_its_commits_after_a_restart(tmp_path: Path) -> None:
    node = ServerProcess(tmp_path / "data", {"LAKEBROKER_FLUSH_INTERVAL_MS": "50"}, port=free_port(),
                         kafka_port=free_port())
    try:
        node.start()
        create_topic(node, "resume", PARTITIONS)
        _produce(node, "resume", 0, 100)
        first: dict[str, str] = {}
        consumer = _consumer(node, "g-resume")
        consumer.subscribe(["resume"])
        _drain(consumer, 5, first, "first")
        consumer.close()
        assert len(first) == 100
        node.stop()
        node.start()
        _produce(node, "resume", 100, 50)
        second: dict[str, str] = {}
        consumer = _consumer(node, "g-resume")
        consumer.subscribe(["resume"])
        _drain(consumer, 5, second, "second")
        consumer.close()
        assert set(second) == {f"v{i}" for i in range(100, 150)}  # only what came after its commits
    finally:
        node.stop()


def test_the_admin_client_lists_and_describes_groups(server: ServerProcess) -> None:
    create_topic(server, "described", PARTITIONS)
    _produce(server, "described", 0, 10)
    consumer = _consumer(server, "g-described", **{"client.id": "described-client"})
    consumer.subscribe(["described"])
    _drain(consumer, 3, {}, "c")
    admin = KafkaAdminClient(bootstrap_servers=server.kafka)
    try:
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert listed["g-described"]["group_state"] == "Stable", listed
        described = admin.describe_groups(["g-described"])["g-described"]
        assert (described["group_state"], described["protocol_type"]) == ("Stable", "consumer")
        assert [m["client_id"] for m in described["members"]] == ["described-client"]
        (assigned,) = described["members"][0]["member_assignment"]["assigned_partitions"]
        assert (assigned["topic"], sorted(assigned["partitions"])) == ("described", list(range(PARTITIONS)))
        offsets = admin.list_group_offsets({"g-described": None})["g-described"]
        assert sum(o.offset for tp, o in offsets.items() if tp.topic == "described") == 10
    finally:
        admin.close()
        consumer.close()


def test_a_member_that_stops_heartbeating_is_dropped(server: ServerProcess) -> None:
    """A raw member joins with the shortest session (6 s) and goes silent: it is dropped, and the
    group with it. A session outside 6 s - 30 min is refused."""
    session = datetime.timedelta(seconds=6)
    with KafkaConnection(server.kafka) as kafka:
        joined = kafka.call(JoinGroupRequest(
            group_id="g-silent", session_timeout=session, rebalance_timeout=session, member_id="",
            group_instance_id=None, protocol_type="consumer", reason=None,
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b"\0"),)))
        assert joined.error_code == ErrorCode.none and joined.leader == joined.member_id
        synced = kafka.call(SyncGroupRequest(
            group_id="g-silent", generation_id=joined.generation_id, member_id=joined.member_id,
            group_instance_id=None, protocol_type="consumer", protocol_name="range",
            assignments=(SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b"mine"),)))
        assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"mine")

        def state() -> str:
            described = kafka.call(DescribeGroupsRequest(groups=("g-silent",), include_authorized_operations=False))
            return str(described.groups[0].group_state)

        assert state() == "Stable"
        until(lambda: state() == "Dead", "the silent member dropped", timeout=30)
        too_short = kafka.call(JoinGroupRequest(
            group_id="g-silent", session_timeout=datetime.timedelta(seconds=1), rebalance_timeout=session,
            member_id="", group_instance_id=None, protocol_type="consumer", reason=None,
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b"\0"),)))
        assert too_short.error_code == ErrorCode.invalid_session_timeout
