"""The Kafka listener over TLS (settings kafka_tls_cert and kafka_tls_key): librdkafka and
kafka-python produce and consume with security.protocol=SSL, and SASL_SSL when auth is required,
trusting the listener's certificate; a plaintext client gets nothing, and the listener goes on."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition
from pydantic import ValidationError

from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import TokenStore
from tests.servers import ServerProcess, free_port

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, made by openssl."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def _server(root: Path, certificate: tuple[Path, Path], env: dict[str, str] | None = None) -> ServerProcess:
    cert, key = certificate
    return ServerProcess(root / "data", {"LAKEBROKER_KAFKA_TLS_CERT": str(cert), "LAKEBROKER_KAFKA_TLS_KEY": str(key),
                                         **(env or {})}, kafka_port=free_port())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, certificate: tuple[Path, Path]) -> Iterator[ServerProcess]:
    node = _server(tmp_path_factory.mktemp("kafka-tls"), certificate)
    try:
        node.start()
        yield node
    finally:
        node.stop()


def _produce(address: str, topic: str, values: list[bytes], **config: str) -> None:
    producer = Producer({"bootstrap.servers": address, "enable.idempotence": True, **config})
    failures: list[object] = []
    for value in values:
        producer.produce(topic, value=value, partition=0,
                         on_delivery=lambda err, _msg: failures.append(err) if err else None)
    assert producer.flush(60) == 0
    assert failures == []


def _consume(address: str, topic: str, count: int, **config: object) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=address, consumer_timeout_ms=20_000, **config)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        got: list[bytes] = []
        for record in consumer:
            got.append(record.value)
            if len(got) == count:
                break
        return got
    finally:
        consumer.close()


def test_librdkafka_produces_and_kafka_python_consumes_over_tls(server: ServerProcess,
                                                                 certificate: tuple[Path, Path]) -> None:
    r = httpx.post(f"{server.url}/v1/topics", json={"name": "secret", "partitions": 1}, timeout=30)
    assert r.status_code == 201, r.text
    values = [b"over-tls-%d" % i for i in range(20)]
    _produce(server.kafka, "secret", values, **{"security.protocol": "SSL", "ssl.ca.location": str(certificate[0])})
    assert _consume(server.kafka, "secret", 20, security_protocol="SSL", ssl_cafile=str(certificate[0])) == values


def test_a_plaintext_client_gets_no_answer_and_the_listener_goes_on(server: ServerProcess,
                                                                    certificate: tuple[Path, Path]) -> None:
    host, port = server.kafka.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as plain:
        plain.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")  # an ApiVersions request
        try:
            answer = plain.recv(64)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    assert not answer.startswith(b"\x00\x00\x00"), "no Kafka answer in plaintext"
    _produce(server.kafka, "secret", [b"after"], **{"security.protocol": "SSL", "ssl.ca.location": str(certificate[0])})


def test_sasl_over_tls_when_auth_is_required(tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    _, secret = TokenStore(Layout(tmp_path / "data")).create(["admin"], name="tls-admin")
    node = _server(tmp_path, certificate, {"LAKEBROKER_AUTH": "required"})
    try:
        node.start()
        r = httpx.post(f"{node.url}/v1/topics", json={"name": "locked", "partitions": 1}, timeout=30,
                       headers={"authorization": f"Bearer {secret}"})
        assert r.status_code == 201, r.text
        _produce(node.kafka, "locked", [b"signed-in"], **{
            "security.protocol": "SASL_SSL", "ssl.ca.location": str(certificate[0]), "sasl.mechanism": "PLAIN",
            "sasl.username": "any", "sasl.password": secret})
        assert _consume(node.kafka, "locked", 1, security_protocol="SASL_SSL", ssl_cafile=str(certificate[0]),
                        sasl_mechanism="PLAIN", sasl_plain_username="any", sasl_plain_password=secret) == [b"signed-in"]
    finally:
        node.stop()


def test_a_certificate_without_its_key_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="come together"):
        Settings(kafka_tls_cert=Path("cert.pem"))
