"""With auth required, Kafka clients authenticate with SASL/PLAIN and an API token as the password;
the token's scopes and topics hold as they do over HTTP (the produce core checks them), and a token
revoked while its connection is open stops working on it."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from kafka import KafkaProducer
from kafka.errors import TopicAuthorizationFailedError
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.delete_topics.v5.request import DeleteTopicsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.static.primitive import i16, i32, i32Timedelta

from lakebroker.tables.layout import Layout
from lakebroker.tables.tokens import TokenStore
from tests.kafka_wire import KafkaConnection, fetch, partition_answer, produce, record_batch
from tests.servers import ServerProcess

pytestmark = [pytest.mark.timeout(300)]

MINUTE_I32 = i32Timedelta.parse(datetime.timedelta(seconds=60))


@dataclass
class Secured:
    server: ServerProcess
    admin: str
    narrow: str  # produce, to the topic `other` alone
    store: TokenStore


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("kafka-auth")
    store = TokenStore(Layout(root / "data"))
    _, admin = store.create(["admin"], name="admin")
    _, narrow = store.create(["produce"], topics=["other"], name="narrow")
    node = ServerProcess(root / "data", {"LAKEBROKER_AUTH": "required", "LAKEBROKER_AUTH_CACHE_MS": "200"})
    try:
        node.start()
        for topic in ("t", "other"):
            r = httpx.post(f"{node.url}/v1/topics", json={"name": topic, "partitions": 1}, timeout=30,
                           headers={"authorization": f"Bearer {admin}"})
            assert r.status_code == 201, r.text
        yield Secured(node, admin, narrow, store)
    finally:
        node.stop()


def _producer(secured: Secured, token: str) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=secured.server.kafka, security_protocol="SASL_PLAINTEXT",
                         sasl_mechanism="PLAIN", sasl_plain_username="any", sasl_plain_password=token, acks=1,
                         retries=0, max_block_ms=20_000)


def _authenticate(kafka: KafkaConnection, password: str) -> ErrorCode:
    assert kafka.call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    answer = kafka.call(SaslAuthenticateRequest(auth_bytes=b"\0user\0" + password.encode()))
    return ErrorCode(answer.error_code)


def test_a_token_as_the_sasl_password_produces_to_its_topics(secured: Secured) -> None:
    producer = _producer(secured, secured.narrow)
    try:
        placed = producer.send("other", key=b"k", value=b"v").get(timeout=60)
        assert (placed.topic, placed.partition, placed.offset) == ("other", 0, 0)
        with pytest.raises(TopicAuthorizationFailedError):  # the token holds the topic `other` alone
            producer.send("t", value=b"v").get(timeout=60)
    finally:
        producer.close()


def test_a_wrong_password_fails_and_closes_the_connection(secured: Secured) -> None:
    with KafkaConnection(secured.server.kafka) as kafka:
        assert _authenticate(kafka, "lbk_not_a_token") == ErrorCode.sasl_authentication_failed
        assert kafka.closed_by_peer()


def test_no_request_before_authentication(secured: Secured) -> None:
    with KafkaConnection(secured.server.kafka) as kafka:
        kafka.send(MetadataRequest(topics=(MetadataRequestTopic(name="t", topic_id=None),),
                                   allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        assert kafka.closed_by_peer()
    with KafkaConnection(secured.server.kafka) as kafka:
        kafka.send(produce("other", 0, record_batch([b"v"])))
        assert kafka.closed_by_peer()


def test_a_token_revoked_on_an_open_connection_stops_working(secured: Secured) -> None:
    token, secret = secured.store.create(["produce"], name="short-lived")
    time.sleep(0.5)  # past the server's token cache (200 ms): a new token counts from its next read
    with KafkaConnection(secured.server.kafka) as kafka:
        assert _authenticate(kafka, secret) == ErrorCode.none
        assert partition_answer(kafka.call(produce("other", 0, record_batch([b"before"])))).error_code == 0
        secured.store.revoke(token.token_id)
        time.sleep(0.5)  # past the server's token cache (200 ms)
        kafka.send(produce("other", 0, record_batch([b"after"])))
        assert kafka.closed_by_peer()


def test_reading_needs_the_consume_scope(secured: Secured) -> None:
    with KafkaConnection(secured.server.kafka) as kafka:
        assert _authenticate(kafka, secured.narrow) == ErrorCode.none  # produce, to `other`: no consume
        answer = kafka.call(fetch("other", 0, 0, 0))
    assert answer.responses[0].partitions[0].error_code == ErrorCode.topic_authorization_failed
    with KafkaConnection(secured.server.kafka) as kafka:
        assert _authenticate(kafka, secured.admin.removeprefix("Bearer ")) == ErrorCode.none
        answer = kafka.call(fetch("other", 0, 0, 0))
    assert answer.responses[0].partitions[0].error_code == ErrorCode.none


def test_changing_topics_needs_the_admin_scope(secured: Secured) -> None:
    """CreateTopics and DeleteTopics as the HTTP API's topic routes: a produce token is refused
    (TOPIC_AUTHORIZATION_FAILED, nothing made or deleted), an admin token is not."""
    def create(token: str, name: str) -> ErrorCode:
        with KafkaConnection(secured.server.kafka) as kafka:
            assert _authenticate(kafka, token) == ErrorCode.none
            answer = kafka.call(CreateTopicsRequest(topics=(CreatableTopic(
                name=name, num_partitions=i32(1), replication_factor=i16(-1), assignments=(), configs=()),),
                timeout=MINUTE_I32, validate_only=False))
        return ErrorCode(answer.topics[0].error_code)

    def delete(token: str, name: str) -> ErrorCode:
        with KafkaConnection(secured.server.kafka) as kafka:
            assert _authenticate(kafka, token) == ErrorCode.none
            answer = kafka.call(DeleteTopicsRequest(topic_names=(name,), timeout=MINUTE_I32))
        return ErrorCode(answer.responses[0].error_code)

    assert create(secured.narrow, "other-new") == ErrorCode.topic_authorization_failed
    assert delete(secured.narrow, "other") == ErrorCode.topic_authorization_failed
    admin = {"authorization": f"Bearer {secured.admin}"}
    assert httpx.get(f"{secured.server.url}/v1/topics/other", headers=admin, timeout=30).status_code == 200
    assert httpx.get(f"{secured.server.url}/v1/topics/other-new", headers=admin, timeout=30).status_code == 404
    assert create(secured.admin, "made-by-kafka") == ErrorCode.none
    assert delete(secured.admin, "made-by-kafka") == ErrorCode.none
