"""Kafka's admin clients manage topics through the Kafka listener: librdkafka's AdminClient
(confluent-kafka) and kafka-python's KafkaAdminClient create, describe, alter, grow and delete
topics, and what they did is what the HTTP API shows; what the broker cannot keep is refused with
Kafka's error code and a reason."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kafka.admin import ConfigResource as PyConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.admin import NewTopic as PyNewTopic
from kafka.errors import InvalidConfigurationError, TopicAlreadyExistsError

from tests.servers import ServerProcess, described_topic, serving

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("kafka-admin") / "data") as node:
        yield node


def _done(futures: dict[Any, Any]) -> dict[Any, Any]:
    return {k: f.result(timeout=60) for k, f in futures.items()}


def test_librdkafka_admin_creates_describes_alters_grows_and_deletes_a_topic(server: ServerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": server.kafka})
    _done(admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=1, config={
        "retention.ms": "3600000", "cleanup.policy": "compact", "min.insync.replicas": "2"})]))
    shown = described_topic(server, "orders")
    assert shown is not None
    assert (shown["partitions"], shown["retention_ms"], shown["cleanup_policy"]) == (3, 3_600_000, "compact")

    resource = ConfigResource(ConfigResource.Type.TOPIC, "orders")
    (configs,) = _done(admin.describe_configs([resource])).values()
    assert {k: v.value for k, v in configs.items()} == {
        "retention.ms": "3600000", "retention.bytes": "-1", "cleanup.policy": "compact",
        "max.message.bytes": str(shown["max_message_bytes"]), "delete.retention.ms": "86400000"}

    _done(admin.incremental_alter_configs([ConfigResource(ConfigResource.Type.TOPIC, "orders", incremental_configs=[
        ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),  # already so
    ])]))
    shown = described_topic(server, "orders")
    assert shown is not None
    assert (shown["retention_bytes"], shown["retention_ms"], shown["cleanup_policy"]) == (
        1_048_576, 7 * 24 * 3600 * 1000, "compact")
    with pytest.raises(KafkaException) as raised:  # compact and delete at once: not kept here
        _done(admin.incremental_alter_configs([ConfigResource(ConfigResource.Type.TOPIC, "orders",
                                                              incremental_configs=[ConfigEntry(
            "cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND)])]))
    assert raised.value.args[0].name() == "INVALID_CONFIG"
    _done(admin.incremental_alter_configs([ConfigResource(ConfigResource.Type.TOPIC, "orders", incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)])]))
    shown = described_topic(server, "orders")
    assert shown is not None and shown["cleanup_policy"] == "delete"

    _done(admin.create_partitions([NewPartitions("orders", 5)]))
    shown = described_topic(server, "orders")
    assert shown is not None and shown["partitions"] == 5
    assert len(admin.list_topics(timeout=30).topics["orders"].partitions) == 5

    cluster = admin.describe_cluster().result(timeout=30)
    host, port = server.kafka.rsplit(":", 1)
    assert [(n.host, n.port) for n in cluster.nodes] == [(host, int(port))]

    _done(admin.delete_topics(["orders"]))
    assert described_topic(server, "orders") is None


@pytest.mark.parametrize(("topic", "error"), [
    (NewTopic("bad-config", 1, 1, config={"cleanup.policy": "compact,delete"}), "INVALID_CONFIG"),
    (NewTopic("unknown-config", 1, 1, config={"no.such.config": "1"}), "INVALID_CONFIG"),
    (NewTopic("not-a-number", 1, 1, config={"retention.ms": "forever"}), "INVALID_CONFIG"),
    (NewTopic("no/slash", 1, 1), "TOPIC_EXCEPTION"),  # librdkafka's name of INVALID_TOPIC_EXCEPTION
    (NewTopic("zero", 0, 1), "INVALID_PARTITIONS"),
])
def test_what_the_broker_cannot_keep_is_refused_with_kafkas_code(server: ServerProcess, topic: NewTopic,
                                                                 error: str) -> None:
    admin = AdminClient({"bootstrap.servers": server.kafka})
    with pytest.raises(KafkaException) as raised:
        _done(admin.create_topics([topic]))
    assert raised.value.args[0].name() == error, raised.value
    assert described_topic(server, topic.topic) is None


def test_partitions_only_grow_and_an_unknown_topic_is_unknown(server: ServerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": server.kafka})
    _done(admin.create_topics([NewTopic("fixed", 3, 1)]))
    with pytest.raises(KafkaException) as raised:
        _done(admin.create_partitions([NewPartitions("fixed", 2)]))
    assert raised.value.args[0].name() == "INVALID_PARTITIONS"
    with pytest.raises(KafkaException) as raised:
        _done(admin.delete_topics(["never-made"]))
    assert raised.value.args[0].name() == "UNKNOWN_TOPIC_OR_PART"


def test_kafka_python_admin_creates_describes_and_deletes(server: ServerProcess) -> None:
    admin = KafkaAdminClient(bootstrap_servers=server.kafka)
    try:
        admin.create_topics([PyNewTopic("py-topic", 2, 1, topic_configs={"retention.ms": "60000"})])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([PyNewTopic("py-topic", 2, 1)])
        with pytest.raises(InvalidConfigurationError):
            admin.create_topics([PyNewTopic("py-bad", 2, 1, topic_configs={"cleanup.policy": "sometimes"})])
        (by_name,) = admin.describe_configs([PyConfigResource(ConfigResourceType.TOPIC, "py-topic")]).values()
        retention = by_name["py-topic"]["retention.ms"]
        assert retention["value"] == "60000", retention
        admin.delete_topics(["py-topic"])
    finally:
        admin.close()
    assert described_topic(server, "py-topic") is None
