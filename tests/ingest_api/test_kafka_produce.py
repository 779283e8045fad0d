"""Kafka's own clients produce through `lakebroker serve`'s Kafka listener: librdkafka
(confluent-kafka) and kafka-python, idempotent, with every compression codec, keys, headers and
acks=0/1/all; what they were told is what the topic holds. Then what no client would send: damaged
batches, bombs, bad versions and garbage, each answered with Kafka's error code (or the
connection closed) while the listener keeps serving."""

from __future__ import annotations

import datetime
import gzip
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from kafka import KafkaProducer
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32, i64

from lakebroker.ingest_api.partitioner import partition_for_key
from lakebroker.tables.layout import Layout
from tests.kafka_wire import KafkaConnection, partition_answer, produce, record_batch
from tests.servers import ServerProcess, create_topic, free_port, serving, stored_messages, until

pytestmark = [pytest.mark.timeout(300)]

PARTITIONS = 3
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
MINUTE = datetime.timedelta(seconds=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"LAKEBROKER_MAX_REQUEST_BYTES": str(1 << 20), "LAKEBROKER_BODY_READ_TIMEOUT_S": "2"}
    with serving(tmp_path_factory.mktemp("kafka") / "data", env) as node:
        yield node


def _value(m: dict[str, Any]) -> bytes:
    import base64
    return base64.b64decode(m["value_b64"]) if "value_b64" in m else str(m["value"]).encode()


def _sent(count: int, codec: str) -> list[tuple[str, bytes, list[tuple[str, bytes]]]]:
    """Keyed messages, some with headers (one name twice), values of every byte."""
    out = []
    for i in range(count):
        headers = [("trace", f"t-{i}".encode()), ("tag", b"a"), ("tag", b"b")] if i % 3 == 0 else []
        out.append((f"user-{i % 11}", bytes([i % 256]) * (i % 50 + 1) + f"{codec}-{i}".encode(), headers))
    return out


def _check_stored(server: ServerProcess, topic: str, sent: list[tuple[str, bytes, list[tuple[str, bytes]]]],
                  placed: list[tuple[int, int]]) -> None:
    """Every acknowledged message is in the partition and at the offset its producer was told, once,
    with its key, value and headers; keys on Kafka's murmur2 partition."""
    # acks=all answers from the WAL (kafka_acks_all=wal): the table has them within a flush interval
    until(lambda: sum(len(stored_messages(server, topic, p)) for p in range(PARTITIONS)) >= len(sent),
          "every acknowledged message in the table", timeout=30)
    stored = {p: {m["offset"]: m for m in stored_messages(server, topic, p)} for p in range(PARTITIONS)}
    assert sum(len(v) for v in stored.values()) == len(sent)
    for (key, value, headers), (partition, offset) in zip(sent, placed, strict=True):
        assert partition == partition_for_key(key, PARTITIONS), key
        m = stored[partition][offset]
        assert (m["key"], _value(m)) == (key, value)
        assert sorted((m.get("headers") or {}).items()) == sorted({k: v.decode() for k, v in headers}.items())
    for partition, messages in stored.items():
        assert sorted(messages) == list(range(len(messages))), partition  # dense offsets


@pytest.mark.parametrize("codec", CODECS)
def test_librdkafka_idempotent_produce(server: ServerProcess, codec: str) -> None:
    """librdkafka's snappy is the raw form (Java's is framed); its default partitioner is not
    murmur2, so Kafka's Java partitioner is asked for."""
    topic = create_topic(server, f"rd-{codec}", PARTITIONS)
    producer = Producer({"bootstrap.servers": server.kafka, "enable.idempotence": True, "acks": "all",
                         "compression.type": codec, "linger.ms": 20, "partitioner": "murmur2_random"})
    sent = _sent(300, codec)
    placed: list[tuple[int, int] | None] = [None] * len(sent)
    errors: list[Any] = []

    def report(i: int) -> Callable[[Any, Any], None]:
        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                placed[i] = (msg.partition(), msg.offset())
        return done

    for i, (key, value, headers) in enumerate(sent):
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=report(i))
    assert producer.flush(60) == 0
    assert errors == []
    _check_stored(server, topic, sent, [p for p in placed if p is not None])


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_idempotent_produce(server: ServerProcess, codec: str) -> None:
    topic = create_topic(server, f"py-{codec}", PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=server.kafka, enable_idempotence=True, acks="all",
                             compression_type=None if codec == "none" else codec, linger_ms=20)
    try:
        sent = _sent(200, codec)
        futures = [producer.send(topic, key=k.encode(), value=v, headers=h) for k, v, h in sent]
        producer.flush(60)
        placed = [(m.partition, m.offset) for m in (f.get(timeout=60) for f in futures)]
    finally:
        producer.close()
    _check_stored(server, topic, sent, placed)
    # The table keeps a header name that repeats, in its order (JSON reads show its last value)
    rows = DeltaTable(Layout(server.data_dir).topic_table(topic)).to_pyarrow_table(columns=["headers"])
    with_headers = [h for h in rows.column("headers").to_pylist() if h]
    assert len(with_headers) == len([h for _, _, h in sent if h])
    assert all([name for name, _ in h] == ["trace", "tag", "tag"] and [v for _, v in h][1:] == ["a", "b"]
               for h in with_headers)


@pytest.mark.parametrize("acks", [0, 1])
def test_acks_0_and_1(server: ServerProcess, acks: int) -> None:
    topic = create_topic(server, f"acks-{acks}", PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=server.kafka, acks=acks, enable_idempotence=False)
    try:
        futures = [producer.send(topic, key=f"k{i}".encode(), value=b"v") for i in range(50)]
        producer.flush(60)
        for f in futures:
            f.get(timeout=60)
    finally:
        producer.close()
    until(lambda: sum(len(stored_messages(server, topic, p)) for p in range(PARTITIONS)) == 50, "every message stored",
          timeout=30)


def test_pipelined_requests_keep_their_order_and_a_retry_among_them_its_offsets(server: ServerProcess) -> None:
    """Eight idempotent Produce requests to one partition sent without waiting, then a retry of the
    fourth: the answers come in request order, the records are stored in the order sent, and the
    retry is answered with the fourth's offset and stored once."""
    topic = create_topic(server, "pipelined", 1)
    with KafkaConnection(server.kafka) as kafka:
        pid = kafka.call(InitProducerIdRequest(transactional_id=None, transaction_timeout=MINUTE,
                                               producer_id=i64(-1), producer_epoch=-1)).producer_id
        batches = [record_batch([b"r%d-%d" % (r, i) for i in range(10)], producer_id=pid, base_sequence=10 * r)
                   for r in range(8)]
        for batch in [*batches, batches[3]]:
            kafka.send(produce(topic, 0, batch))
        answers = [partition_answer(kafka.receive(0, 9, correlation)) for correlation in range(2, 11)]
    assert [a.error_code for a in answers] == [ErrorCode.none] * 9
    assert [a.base_offset for a in answers] == [0, 10, 20, 30, 40, 50, 60, 70, 30]
    until(lambda: len(stored_messages(server, topic, 0)) >= 80, "every record stored", timeout=30)
    stored = [_value(m) for m in stored_messages(server, topic, 0)]
    assert stored == [b"r%d-%d" % (r, i) for r in range(8) for i in range(10)]


def test_a_partition_refused_in_a_request_leaves_the_others_stored(server: ServerProcess) -> None:
    """One request for a partition that exists and one that does not: the first is stored, the
    second gets UNKNOWN_TOPIC_OR_PARTITION."""
    topic = create_topic(server, "half-there", 1)
    request = ProduceRequest(acks=i16(1), timeout=MINUTE, topic_data=(TopicProduceData(name=topic, partition_data=(
        PartitionProduceData(index=i32(0), records=record_batch([b"here"])),
        PartitionProduceData(index=i32(7), records=record_batch([b"nowhere"]))),),))
    with KafkaConnection(server.kafka) as kafka:
        (answer,) = kafka.call(request).responses
    assert [(p.index, p.error_code) for p in answer.partition_responses] == [
        (0, ErrorCode.none), (7, ErrorCode.unknown_topic_or_partition)]
    until(lambda: [_value(m) for m in stored_messages(server, topic, 0)] == [b"here"], "the good partition stored",
          timeout=30)


def test_a_transactional_producer_gets_kafkas_error(server: ServerProcess) -> None:
    with KafkaConnection(server.kafka) as kafka:
        answer = kafka.call(InitProducerIdRequest(transactional_id="tx-1", transaction_timeout=MINUTE,
                                                  producer_id=i64(-1), producer_epoch=-1))
    assert answer.error_code == ErrorCode.transactional_id_authorization_failed


def test_an_idempotent_retry_after_a_restart_is_stored_once(tmp_path: Path) -> None:
    """The producer's batch is acknowledged, the broker restarts, the producer sends the same batch
    again (it never saw the answer): it is answered with its first offset and stored once."""
    node = ServerProcess(tmp_path / "data", port=free_port(), kafka_port=free_port())
    try:
        node.start()
        create_topic(node, "once", 1)
        with KafkaConnection(node.kafka) as kafka:
            pid = kafka.call(InitProducerIdRequest(transactional_id=None, transaction_timeout=MINUTE,
                                                   producer_id=i64(-1), producer_epoch=-1)).producer_id
            batch = record_batch([b"a", b"b", b"c"], producer_id=pid, base_sequence=0)
            first = partition_answer(kafka.call(produce("once", 0, batch)))
        assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
        node.stop()
        node.start()
        with KafkaConnection(node.kafka) as kafka:
            again = partition_answer(kafka.call(produce("once", 0, batch)))
            nxt = partition_answer(kafka.call(produce("once", 0, record_batch([b"d"], producer_id=pid,
                                                                                  base_sequence=3))))
        assert (again.error_code, again.base_offset) == (ErrorCode.none, 0)
        assert (nxt.error_code, nxt.base_offset) == (ErrorCode.none, 3)
        until(lambda: len(stored_messages(node, "once", 0)) >= 4, "the table has the four records", timeout=30)
        assert [_value(m) for m in stored_messages(node, "once", 0)] == [b"a", b"b", b"c", b"d"]
    finally:
        node.stop()


def test_a_gap_in_a_producers_sequences_is_refused_until_the_missing_batch_lands(server: ServerProcess) -> None:
    """Kafka's contract for an idempotent producer: its sequences in a partition follow on. A batch
    that starts past the next sequence (the batch before it is still on its way, say appended again
    by a partition's former owner) is refused with OUT_OF_ORDER_SEQUENCE_NUMBER and nothing of it
    stored; once the missing batch lands, the same batch is stored after it. Taken as it came, the
    later batch would raise the producer's mark past the missing one, which would then be answered
    as a duplicate and never stored."""
    topic = create_topic(server, "gapped", 1)
    with KafkaConnection(server.kafka) as kafka:
        pid = kafka.call(InitProducerIdRequest(transactional_id=None, transaction_timeout=MINUTE,
                                               producer_id=i64(-1), producer_epoch=-1)).producer_id
        first = partition_answer(kafka.call(produce(topic, 0, record_batch([b"s0", b"s1", b"s2"], producer_id=pid,
                                                                           base_sequence=0))))
        later = record_batch([b"s10", b"s11"], producer_id=pid, base_sequence=10)
        early = partition_answer(kafka.call(produce(topic, 0, later)))
        missing = partition_answer(kafka.call(produce(topic, 0, record_batch(
            [b"s%d" % i for i in range(3, 10)], producer_id=pid, base_sequence=3))))
        again = partition_answer(kafka.call(produce(topic, 0, later)))
    assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
    assert early.error_code == ErrorCode.out_of_order_sequence_number
    assert (missing.error_code, missing.base_offset) == (ErrorCode.none, 3)
    assert (again.error_code, again.base_offset) == (ErrorCode.none, 10)
    until(lambda: len(stored_messages(server, topic, 0)) >= 12, "the twelve records stored", timeout=30)
    assert [_value(m) for m in stored_messages(server, topic, 0)] == [b"s%d" % i for i in range(12)]


def test_sequences_that_wrap_past_int32_go_on_being_stored(server: ServerProcess) -> None:
    """Kafka's sequences are int32 and wrap to 0 after 2^31 - 1: a producer writing 10,000 records
    a second to a partition wraps in under three days. A batch across the wrap and the batches after
    it are stored in order, and a retry of the one across the wrap is still answered as itself."""
    topic = create_topic(server, "wrapping", 1)
    top = 2**31 - 1
    with KafkaConnection(server.kafka) as kafka:
        pid = kafka.call(InitProducerIdRequest(transactional_id=None, transaction_timeout=MINUTE,
                                               producer_id=i64(-1), producer_epoch=-1)).producer_id
        sent = [(top - 4, [b"a", b"b"]), (top - 2, [b"c", b"d", b"e", b"f"]), (1, [b"g", b"h"]), (3, [b"i"])]
        answers = [partition_answer(kafka.call(produce(topic, 0, record_batch(values, producer_id=pid,
                                                                             base_sequence=base))))
                   for base, values in sent]
        retry = partition_answer(kafka.call(produce(topic, 0, record_batch([b"c", b"d", b"e", b"f"], producer_id=pid,
                                                                           base_sequence=top - 2))))
    assert [(a.error_code, a.base_offset) for a in answers] == [(ErrorCode.none, 0), (ErrorCode.none, 2),
                                                                 (ErrorCode.none, 6), (ErrorCode.none, 8)]
    assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 2)
    until(lambda: len(stored_messages(server, topic, 0)) >= 9, "the nine records stored", timeout=30)
    assert [_value(m) for m in stored_messages(server, topic, 0)] == [bytes([c]) for c in b"abcdefghi"]


# -- what no client would send ----------------------------------------------------------------------
def _gzip_batch(plain_records: bytes, count: int) -> bytes:
    """A batch whose records are `plain_records` (already laid end to end), gzipped."""
    good = record_batch([b"x"] * count)
    head = bytearray(good[:61])
    body = gzip.compress(plain_records)
    head[21:23] = struct.pack(">h", 1)  # attributes: gzip
    return _resealed(bytes(head) + body)


def _resealed(batch: bytes) -> bytes:
    """`batch` with its length and CRC32C made right again."""
    from crc32c import crc32c
    out = bytearray(batch)
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def _answer(server: ServerProcess, topic: str, records: bytes) -> ErrorCode:
    with KafkaConnection(server.kafka) as kafka:
        return ErrorCode(partition_answer(kafka.call(produce(topic, 0, records))).error_code)


def test_damaged_batches_get_kafkas_error_codes(server: ServerProcess) -> None:
    topic = create_topic(server, "damaged", 1)
    good = record_batch([b"v1", b"v2"])
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    assert _answer(server, topic, bytes(flipped)) == ErrorCode.corrupt_message  # the CRC no longer holds
    assert _answer(server, topic, good[:-3]) == ErrorCode.corrupt_message  # cut short
    wrong_count = bytearray(good)
    struct.pack_into(">i", wrong_count, 57, 3)
    assert _answer(server, topic, _resealed(bytes(wrong_count))) == ErrorCode.corrupt_message
    codec_7 = bytearray(good)
    codec_7[22] = 7
    assert _answer(server, topic, _resealed(bytes(codec_7))) == ErrorCode.unsupported_compression_type
    assert _answer(server, topic, record_batch([b"v"], key=b"\xff\xfe")) == ErrorCode.invalid_record  # not UTF-8
    assert _answer(server, topic, record_batch([b"v"], headers=((b"h", b"\xff"),))) == ErrorCode.invalid_record
    assert _answer(server, "no-such-topic", good) == ErrorCode.unknown_topic_or_partition
    assert stored_messages(server, topic, 0) == []  # nothing of the refused batches was stored
    assert _answer(server, topic, good) == ErrorCode.none
    assert _metric(server, 'lakebroker_kafka_partition_errors_total{api="Produce",error="CORRUPT_MESSAGE"}') >= 3


def test_a_compression_bomb_is_too_large_not_out_of_memory(server: ServerProcess) -> None:
    """A 1 MiB request limit: a small gzip batch that expands to 64 MiB is refused while it expands."""
    topic = create_topic(server, "bomb", 1)
    record = bytes([0x80, 0x80, 0x80, 0x40]) + b"\0" * (64 << 20)  # a record that says it is 64 MiB long
    bomb = _gzip_batch(record, 1)
    assert len(bomb) < 100_000
    assert _answer(server, topic, bomb) == ErrorCode.message_too_large
    assert _answer(server, topic, record_batch([b"still serving"])) == ErrorCode.none


def _metric(server: ServerProcess, sample: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample + " "))


def test_garbage_closes_only_its_own_connection(server: ServerProcess) -> None:
    closed = _metric(server, 'lakebroker_kafka_connections_closed_total{reason="malformed"}')
    with KafkaConnection(server.kafka) as kafka:
        kafka.sock.sendall(struct.pack(">i", 1 << 30))  # a request larger than any limit
        assert kafka.closed_by_peer()
    with KafkaConnection(server.kafka) as kafka:
        kafka.send_raw(os.urandom(64))  # an unknown API, a made-up header
        assert kafka.closed_by_peer()
    with KafkaConnection(server.kafka) as kafka:  # a request that never arrives whole (body_read_timeout_s 2)
        kafka.sock.sendall(struct.pack(">i", 100) + b"\0" * 10)
        assert kafka.closed_by_peer()
    with KafkaConnection(server.kafka) as kafka:
        kafka.send_raw(struct.pack(">hhi", 18, 99, 1) + b"\xff\xff")  # ApiVersions v99
        kafka.correlation = 1
        answer = kafka.receive(18, 0)  # KIP-511: answered in v0 with the versions it has
        assert answer.error_code == ErrorCode.unsupported_version and answer.api_keys
    with KafkaConnection(server.kafka) as kafka:
        versions = kafka.call(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        assert versions.error_code == ErrorCode.none
        assert {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}[0] == (3, 9)
    assert _metric(server, 'lakebroker_kafka_connections_closed_total{reason="malformed"}') >= closed + 3
    assert _metric(server, 'lakebroker_kafka_requests_total{api="ApiVersions"}') >= 1


def test_acks_all_can_wait_for_the_table(tmp_path: Path) -> None:
    """kafka_acks_all=table, records flushed 5 s after they arrive: acks=1 is answered from the WAL,
    before the record is in the table; acks=all once it is, so both read back at once."""
    node = ServerProcess(tmp_path / "data", {"LAKEBROKER_KAFKA_ACKS_ALL": "table",
                                             "LAKEBROKER_FLUSH_INTERVAL_MS": "5000"})
    try:
        node.start()
        create_topic(node, "to-table", 1)
        with KafkaConnection(node.kafka) as kafka:
            wal = partition_answer(kafka.call(produce("to-table", 0, record_batch([b"at-wal"]), acks=1)))
            assert stored_messages(node, "to-table", 0) == []  # acknowledged, not yet committed
            table = partition_answer(kafka.call(produce("to-table", 0, record_batch([b"at-table"]), acks=-1)))
        assert (wal.error_code, wal.base_offset, table.error_code, table.base_offset) == (0, 0, 0, 1)
        assert [_value(m) for m in stored_messages(node, "to-table", 0)] == [b"at-wal", b"at-table"]
    finally:
        node.stop()
