"""Consumer against a real `lakebroker serve`: order, commits and resuming, several topics, start positions,
deserializers, seek."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakebroker.ingest_api.partitioner import partition_for_key
from lakebroker.tables.layout import Layout
from lakebroker_client import ClientError, Consumer, FileOffsetStore, Message, Producer, RequestRefused
from lakebroker_client import TopicPartition as TP
from tests.client.conftest import Broker


def produce(broker: Broker, topic: str, values: list[object], **kwargs: object) -> dict[tuple[int, int], object]:
    """Send values (ack=table, so they are readable at once); returns {(partition, offset): value}."""
    with Producer(broker.url, broker.token) as p:
        futures = [p.send(topic, v, key=f"k{i % 5}", ack="table", **kwargs) for i, v in enumerate(values)]  # type: ignore[arg-type]
        results = [f.result(timeout=30) for f in futures]
    out: dict[tuple[int, int], object] = {}
    for r, v in zip(results, values, strict=True):
        assert r.offset is not None
        out[(r.partition, r.offset)] = v
    return out


def read(consumer: Consumer, count: int, timeout: float = 30) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages arrived"
        got.extend(consumer.poll(count - len(got), timeout_s=1))
    return got


def assert_in_order(messages: list[Message]) -> None:
    by_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
    for m in messages:
        by_partition[(m.topic, m.partition)].append(m.offset)
    for offsets in by_partition.values():
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


def test_reads_every_partition_in_order_commits_to_a_file_and_resumes(broker: Broker, tmp_path: Path) -> None:
    topic = broker.create_topic("c-file", partitions=3)
    sent = produce(broker, topic, list(range(30)))
    store = FileOffsetStore(tmp_path / "positions.json")

    with Consumer(broker.url, topic, token=broker.token, offset_store=store, max_poll_records=7) as first:
        part1 = read(first, 12)
        committed = first.commit()
    assert json.loads((tmp_path / "positions.json").read_text()) == {
        topic: {str(tp.partition): o for tp, o in committed.items()}}

    with Consumer(broker.url, topic, token=broker.token, offset_store=store) as second:
        assert second.positions() == committed
        part2 = read(second, 18)
        assert second.poll(timeout_s=0.2) == []
        assert second.lag() == {TP(topic, 0): 0, TP(topic, 1): 0, TP(topic, 2): 0}

    everything = part1 + part2
    assert_in_order(everything)
    assert {(m.partition, m.offset): m.value for m in everything} == sent, "each message exactly once"
    assert all(m.topic == topic and m.key is not None for m in everything)


def test_a_group_commits_on_the_broker_and_the_next_consumer_resumes(group_broker: Broker) -> None:
    topic = group_broker.create_topic("c-group", partitions=2)
    sent = produce(group_broker, topic, [f"v{i}" for i in range(20)])

    consumer = Consumer(group_broker.url, topic, group_id="billing", token=group_broker.token)
    first: list[Message] = []
    for message in consumer:  # iteration moves the position one message at a time
        first.append(message)
        if len(first) == 8:
            break
    committed = consumer.commit()
    assert sum(committed.values()) == 8
    consumer.close()

    with group_broker.admin() as admin:
        shown = admin.get(f"/v1/topics/{topic}/groups/billing/offsets").json()
    assert {TP(topic, int(p)): o for p, o in shown["offsets"].items()} == committed

    with Consumer(group_broker.url, topic, group_id="billing", token=group_broker.token) as again:
        rest = read(again, 12)
        again.commit()
    assert {(m.partition, m.offset): m.value for m in first + rest} == sent
    assert all(m.format == "text" for m in rest)

    with Consumer(group_broker.url, topic, group_id="other", token=group_broker.token) as other:
        assert len(read(other, 20)) == 20, "another group starts from the beginning"


def test_one_consumer_reads_several_topics_and_commits_each(group_broker: Broker) -> None:
    orders, payments = group_broker.create_topic("c-multi-a", partitions=2), group_broker.create_topic("c-multi-b", 1)
    sent = {orders: produce(group_broker, orders, [f"o{i}" for i in range(6)]),
            payments: produce(group_broker, payments, [f"p{i}" for i in range(4)])}
    with Consumer(group_broker.url, orders, payments, group_id="multi", token=group_broker.token) as consumer:
        assert consumer.subscription() == {orders, payments}
        assert consumer.assignment() == {TP(orders, 0), TP(orders, 1), TP(payments, 0)}
        got = read(consumer, 10)
        committed = consumer.commit()
        assert consumer.poll(timeout_s=0.2) == []
    assert_in_order(got)
    for topic in (orders, payments):
        assert {(m.partition, m.offset): m.value for m in got if m.topic == topic} == sent[topic]
    assert committed == {TP(orders, 0): sum(1 for p, _ in sent[orders] if p == 0),
                         TP(orders, 1): sum(1 for p, _ in sent[orders] if p == 1), TP(payments, 0): 4}
    with group_broker.admin() as admin:
        for topic in (orders, payments):
            shown = admin.get(f"/v1/topics/{topic}/groups/multi/offsets").json()["offsets"]
            assert {TP(topic, int(p)): o for p, o in shown.items()} == {
                tp: o for tp, o in committed.items() if tp.topic == topic}, "each topic's positions on the broker"

    produce(group_broker, payments, ["p-late"])
    with Consumer(group_broker.url, orders, group_id="multi", token=group_broker.token) as consumer:
        assert consumer.poll(timeout_s=0.3) == [], "resumes where the group committed"
        consumer.subscribe([payments])
        assert consumer.assignment() == {TP(payments, 0)}
        (late,) = read(consumer, 1)
        assert (late.topic, late.value) == (payments, "p-late")


def test_partitions_added_later_are_picked_up_and_bytes_keys_partition_as_kafka(broker: Broker) -> None:
    topic = broker.create_topic("c-grow", partitions=1)
    produce(broker, topic, ["before"])
    with Consumer(broker.url, topic, token=broker.token, metadata_max_age_s=0) as consumer:
        assert [m.value for m in read(consumer, 1)] == ["before"]
        with broker.admin() as admin:
            assert admin.patch(f"/v1/topics/{topic}", json={"partitions": 6}).status_code == 200
        with Producer(broker.url, broker.token) as p:
            as_bytes = p.send(topic, "bytes key", key=b"user-7", ack="table").result(30)
            as_text = p.send(topic, "str key", key="user-7", ack="table").result(30)
        assert as_bytes.partition == as_text.partition == partition_for_key("user-7", 6) == 2
        got = read(consumer, 2)
        assert [(m.partition, m.key, m.value) for m in got] == [(2, "user-7", "bytes key"), (2, "user-7", "str key")]
        assert TP(topic, 5) in consumer.assignment()


def test_positions_outside_the_log_move_to_its_start_or_per_auto_offset_reset(broker: Broker,
                                                                             tmp_path: Path) -> None:
    topic = broker.create_topic("c-range", partitions=1)
    produce(broker, topic, list(range(6)))
    DeltaTable(str(Layout(broker.data_dir).topic_table(topic))).delete('"offset" < 3')  # as retention would
    store = FileOffsetStore(tmp_path / "positions.json")
    store.save(topic, {0: 1})
    with Consumer(broker.url, topic, token=broker.token, offset_store=store, auto_offset_reset="latest") as consumer:
        assert [m.offset for m in read(consumer, 3)] == [3, 4, 5], "removed by retention: on from the log start"
    store.save(topic, {0: 100})
    with Consumer(broker.url, topic, token=broker.token, offset_store=store, auto_offset_reset="earliest") as consumer:
        assert [m.offset for m in read(consumer, 3)] == [3, 4, 5], "past the log end: reset to earliest"
    with Consumer(broker.url, topic, token=broker.token, offset_store=store, auto_offset_reset="latest") as consumer:
        assert consumer.poll(timeout_s=0.3) == []
        assert consumer.positions() == {TP(topic, 0): 6}, "past the log end: reset to latest"


def test_group_offsets_api_refuses_bad_commits(group_broker: Broker) -> None:
    topic = group_broker.create_topic("c-refuse", partitions=2)
    produce(group_broker, topic, [1, 2, 3])
    with group_broker.admin() as admin:
        path = f"/v1/topics/{topic}/groups/g/offsets"
        assert admin.get(path).json() == {"topic": topic, "group": "g", "offsets": {}}
        assert admin.post(path, json={"offsets": {"0": 10_000}}).status_code == 416
        assert admin.post(path, json={"offsets": {"5": 0}}).status_code == 400
        assert admin.post(path, json={"offsets": {}}).status_code == 422
        assert admin.post(f"/v1/topics/{topic}/groups/bad:name/offsets", json={"offsets": {"0": 0}}).status_code == 400
        assert admin.post("/v1/topics/nope/groups/g/offsets", json={"offsets": {"0": 0}}).status_code == 404


def test_start_latest_skips_history_and_values_keep_their_kind(broker: Broker) -> None:
    topic = broker.create_topic("c-latest", partitions=2)
    produce(broker, topic, list(range(5)))
    with Consumer(broker.url, topic, token=broker.token, auto_offset_reset="latest") as consumer:
        assert consumer.poll(timeout_s=0.3) == []
        produce(broker, topic, [b"\x00\x01", "text", {"a": [1, 2]}, None])
        got = sorted(read(consumer, 4), key=lambda m: (m.timestamp, m.partition, m.offset))
        with pytest.raises(ClientError, match="nowhere to commit"):
            consumer.commit()
    by_format = {m.format: m for m in got if m.value is not None}
    assert by_format["binary"].data == b"\x00\x01" and by_format["binary"].value == b"\x00\x01"
    assert by_format["text"].value == "text" and by_format["text"].data == b"text"
    assert by_format["json"].value == {"a": [1, 2]} and by_format["json"].data == b'{"a":[1,2]}'
    assert any(m.value is None and m.data is None for m in got), "the tombstone"


def test_deserializers_get_the_bytes_as_in_kafka(broker: Broker) -> None:
    topic = broker.create_topic("c-deser", partitions=1)
    produce(broker, topic, [b"\x00\x01", "text", {"a": 1}, None])
    seen_keys: list[bytes] = []
    with Consumer(broker.url, topic, token=broker.token, value_deserializer=lambda b: b[::-1],
                  key_deserializer=lambda k: seen_keys.append(k) or k.decode().upper()) as consumer:
        got = read(consumer, 4)
    assert [m.value for m in got] == [b"\x01\x00", b"txet", b"}1:\"a\"{", None], "tombstones are not deserialized"
    assert [m.key for m in got] == ["K0", "K1", "K2", "K3"] and seen_keys == [b"k0", b"k1", b"k2", b"k3"]
    assert got[0].data == b"\x00\x01", "data keeps the bytes as produced"


def test_seek_rereads_and_fixed_partitions(broker: Broker) -> None:
    topic = broker.create_topic("c-seek", partitions=3)
    sent = produce(broker, topic, list(range(12)))
    on_one = sorted(o for p, o in sent if p == 1)
    with Consumer(broker.url, token=broker.token, partitions=[TP(topic, 1)]) as consumer:
        first = read(consumer, len(on_one))
        assert [m.offset for m in first] == on_one and {m.partition for m in first} == {1}
        consumer.seek(TP(topic, 1), on_one[1])
        assert [m.offset for m in read(consumer, len(on_one) - 1)] == on_one[1:]
        with pytest.raises(ValueError):
            consumer.seek(TP(topic, 0), 0)
        with pytest.raises(ValueError):
            consumer.subscribe([topic])
    with pytest.raises(ValueError, match="no partition 7"):
        Consumer(broker.url, token=broker.token, partitions=[TP(topic, 7)]).poll()
    with pytest.raises(ValueError, match="not both"):
        Consumer(broker.url, topic, partitions=[TP(topic, 1)])


def test_a_missing_or_wrong_token_is_refused_at_once(broker: Broker) -> None:
    with pytest.raises(RequestRefused) as missing:
        Consumer(broker.url, "c-file").poll()
    assert missing.value.status == 401
    with Producer(broker.url, "lbk_000000000000_" + "x" * 43) as p:
        error = p.send("c-file", 1).exception(timeout=10)
    assert isinstance(error, RequestRefused) and error.status == 401 and p.stats().retries == 0
