"""Kafka consumers read topics through the Kafka listener: messages produced over HTTP come out of
librdkafka (confluent-kafka) and kafka-python consumers with the same keys, values, headers and
offsets; a consumer at the end waits for the next commit (Fetch's long poll); ListOffsets answers
the log start, the log end and the offset for a time; an offset past the end is Kafka's
OFFSET_OUT_OF_RANGE."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as RdPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as PyPartition
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v6.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.static.primitive import i32, i64

from tests.kafka_wire import KafkaConnection, fetch
from tests.servers import ServerProcess, create_topic, serving

pytestmark = [pytest.mark.timeout(300)]

PARTITIONS = 2
COUNT = 400


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("kafka-consume") / "data", {"LAKEBROKER_FLUSH_INTERVAL_MS": "50"}) as node:
        yield node


def _produce_http(server: ServerProcess, topic: str, count: int) -> list[dict[str, Any]]:
    """`count` messages over HTTP (text, JSON and binary values, some with headers), committed to the
    table (ack=table); their placements as the broker answered."""
    messages = []
    for i in range(count):
        m: dict[str, Any] = {"key": f"user-{i % 13}"}
        if i % 3 == 0:
            m["value"] = f"text-{i}"
        elif i % 3 == 1:
            m["value"] = {"n": i}
        else:
            m["value_b64"] = base64.b64encode(bytes([i % 256, 0, 255])).decode()
        if i % 4 == 0:
            m["headers"] = {"trace": f"t{i}", "source": "http"}
        messages.append(m)
    r = httpx.post(f"{server.url}/v1/topics/{topic}/batch", params={"ack": "table"}, json={"messages": messages},
                   timeout=60)
    assert r.status_code == 200, r.text
    out = []
    for m, placed in zip(messages, r.json()["results"], strict=True):
        out.append({**m, "partition": placed["partition"], "offset": placed["offset"]})
    return out


def _value_bytes(m: dict[str, Any]) -> bytes:
    if "value_b64" in m:
        return base64.b64decode(m["value_b64"])
    if isinstance(m["value"], str):
        return bytes(m["value"].encode())
    import orjson
    return bytes(orjson.dumps(m["value"]))


def _expected(sent: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[str, bytes, list[tuple[str, bytes]]]]:
    return {(m["partition"], m["offset"]): (m["key"], _value_bytes(m),
                                            sorted((k, v.encode()) for k, v in m.get("headers", {}).items()))
            for m in sent}


def test_librdkafka_reads_what_http_produced(server: ServerProcess) -> None:
    create_topic(server, "from-http-rd", PARTITIONS)
    sent = _produce_http(server, "from-http-rd", COUNT)
    consumer = Consumer({"bootstrap.servers": server.kafka, "group.id": "unused", "enable.auto.commit": False,
                         "message.max.bytes": 4096, "fetch.max.bytes": 4096,
                         "max.partition.fetch.bytes": 1024})  # many small fetches
    consumer.assign([RdPartition("from-http-rd", p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], tuple[str, bytes, list[tuple[str, bytes]]]] = {}
    deadline = time.monotonic() + 60
    try:
        while len(got) < COUNT and time.monotonic() < deadline:
            for m in consumer.consume(500, 1.0):
                assert m.error() is None, m.error()
                got[(m.partition(), m.offset())] = (m.key().decode(), m.value(), sorted(m.headers() or []))
    finally:
        consumer.close()
    assert got == _expected(sent)


def test_kafka_python_reads_what_http_produced(server: ServerProcess) -> None:
    create_topic(server, "from-http-py", PARTITIONS)
    sent = _produce_http(server, "from-http-py", COUNT)
    consumer = KafkaConsumer(bootstrap_servers=server.kafka, group_id=None, enable_auto_commit=False)
    parts = [PyPartition("from-http-py", p) for p in range(PARTITIONS)]
    consumer.assign(parts)
    consumer.seek_to_beginning()
    got: dict[tuple[int, int], tuple[str, bytes, list[tuple[str, bytes]]]] = {}
    deadline = time.monotonic() + 60
    try:
        while len(got) < COUNT and time.monotonic() < deadline:
            for records in consumer.poll(1000).values():
                for r in records:
                    got[(r.partition, r.offset)] = (r.key.decode(), r.value, sorted(r.headers))
        ends = consumer.end_offsets(parts)
        beginnings = consumer.beginning_offsets(parts)
    finally:
        consumer.close()
    assert got == _expected(sent)
    counts = {p: sum(1 for m in sent if m["partition"] == p) for p in range(PARTITIONS)}
    assert {tp.partition: end for tp, end in ends.items()} == counts
    assert set(beginnings.values()) == {0}


def test_a_fetch_at_the_end_waits_for_the_next_commit(server: ServerProcess) -> None:
    """A Fetch at the log end with a 60 s max wait: answered with the record produced meanwhile, at
    its commit, not at the end of the wait."""
    create_topic(server, "long-poll", PARTITIONS)
    with KafkaConnection(server.kafka, timeout=90) as kafka:
        started = time.monotonic()
        kafka.send(fetch("long-poll", 0, 0, 60))
        time.sleep(0.5)
        r = httpx.post(f"{server.url}/v1/topics/long-poll/messages", json={"value": "late", "partition": 0},
                       timeout=30)
        assert r.status_code == 200, r.text
        answer = kafka.receive(1, 12)
        waited = time.monotonic() - started
    (topic,) = answer.responses
    (partition,) = topic.partitions
    assert partition.error_code == ErrorCode.none and partition.high_watermark == 1
    assert partition.records and b"late" in bytes(partition.records)
    assert waited < 60, waited  # woken by the commit


def test_offsets_out_of_range_and_list_offsets(server: ServerProcess) -> None:
    create_topic(server, "offsets", PARTITIONS)
    before_ms = int(time.time() * 1000)
    for i in range(3):
        r = httpx.post(f"{server.url}/v1/topics/offsets/messages", params={"ack": "table"},
                       json={"value": f"m{i}", "partition": 0}, timeout=30)
        assert r.status_code == 200, r.text
    with KafkaConnection(server.kafka) as kafka:
        past = kafka.call(fetch("offsets", 0, 4, 0))
        assert past.responses[0].partitions[0].error_code == ErrorCode.offset_out_of_range
        listed = kafka.call(ListOffsetsRequest(replica_id=i32(-1), isolation_level=0, topics=(ListOffsetsTopic(
            name="offsets", partitions=tuple(ListOffsetsPartition(partition_index=i32(0), timestamp=i64(ts))
                                             for ts in (-2, -1, before_ms, before_ms + 3_600_000))),)))
    answers = [(p.error_code, p.offset) for p in listed.topics[0].partitions]
    assert answers == [(ErrorCode.none, 0), (ErrorCode.none, 3), (ErrorCode.none, 0), (ErrorCode.none, -1)]
