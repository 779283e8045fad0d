"""WebhookVerifier: signatures made by the broker's own Signer, and real deliveries from a real broker
to the demo receiver (examples/receiver.py) under uvicorn."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from examples.receiver import create_app
from lakebroker.delivery_worker.signer import Signer
from lakebroker_client import Delivery, InvalidDelivery, Producer, SignatureInvalid, WebhookVerifier
from tests.client.conftest import Broker
from tests.servers import AppThread
from tests.waiting import eventually


def secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


OLD, NEW, OTHER = secret(), secret(), secret()


def envelope(offset: int = 0, value: Any = "hello") -> dict[str, Any]:
    return {"topic": "orders", "partition": 1, "offset": offset, "timestamp": "2026-01-02T03:04:05.000006+00:00",
            "key": "k", "value": value, "format": "text", "headers": None, "id": None, "producer_id": None,
            "sequence": None}


def signed(body: Any, secrets: tuple[str, ...], msg_id: str = "msg_orders_1_0",
           now: datetime | None = None) -> tuple[bytes, dict[str, str]]:
    text = orjson.dumps(body).decode()
    return text.encode(), Signer(secrets).headers(msg_id, text, now)


def test_a_delivery_signed_with_the_secret_verifies_and_parses() -> None:
    body, headers = signed(envelope(), (NEW,))
    delivery = WebhookVerifier(NEW).verify(body, headers)
    assert delivery.id == "msg_orders_1_0" and not delivery.batch
    assert (delivery.message.topic, delivery.message.partition, delivery.message.offset) == ("orders", 1, 0)
    assert delivery.message.value == "hello" and delivery.message.timestamp.tzinfo is not None
    assert abs((delivery.timestamp - datetime.now(UTC)).total_seconds()) < 5


def test_rotation_either_side_may_move_first() -> None:
    receiver_rotating = WebhookVerifier([OLD, NEW])  # the receiver took the new secret first
    assert receiver_rotating.verify(*signed(envelope(), (OLD,))).message.offset == 0
    assert receiver_rotating.verify(*signed(envelope(), (NEW,))).message.offset == 0
    broker_rotating = signed(envelope(), (NEW, OLD))  # the broker signs with both until end_rotation
    assert WebhookVerifier(OLD).verify(*broker_rotating).message.offset == 0
    assert WebhookVerifier(NEW).verify(*broker_rotating).message.offset == 0


def test_batches_parse_to_every_message() -> None:
    body, headers = signed([envelope(5), envelope(6, {"n": 1})], (NEW,), "msg_orders_1_5-6")
    delivery = WebhookVerifier(NEW).verify(body, headers)
    assert delivery.batch and [m.offset for m in delivery.messages] == [5, 6]
    assert delivery.messages[1].value == {"n": 1}


@pytest.mark.parametrize("forge", ["wrong secret", "tampered body", "stale", "garbage signature", "no headers"])
def test_forgeries_are_refused(forge: str) -> None:
    body, headers = signed(envelope(), (NEW,))
    if forge == "wrong secret":
        body, headers = signed(envelope(), (OTHER,))
    elif forge == "tampered body":
        body = body.replace(b"hello", b"HELLO")
    elif forge == "stale":
        body, headers = signed(envelope(), (NEW,), now=datetime.now(UTC) - timedelta(minutes=10))
    elif forge == "garbage signature":
        headers["webhook-signature"] = "garbage"
    else:
        headers = {}
    with pytest.raises(SignatureInvalid):
        WebhookVerifier([OLD, NEW]).verify(body, headers)


def test_signed_bodies_that_are_no_envelope_and_bad_secrets() -> None:
    with pytest.raises(InvalidDelivery):
        WebhookVerifier(NEW).verify(*signed({"hello": "world"}, (NEW,)))
    with pytest.raises(InvalidDelivery):
        WebhookVerifier(NEW).verify(*signed([], (NEW,)))
    for broken in ({**envelope(), "offset": "7"}, {**envelope(), "timestamp": "yesterday"},
                   {**envelope(), "format": "xml"}, {**envelope(), "value_b64": "!!"}, [envelope(), 5]):
        with pytest.raises(InvalidDelivery):
            WebhookVerifier(NEW).verify(*signed(broken, (NEW,)))
    for bad in ("", "whsec_", "whsec_!!!", []):
        with pytest.raises(ValueError):
            WebhookVerifier(bad)


def test_the_fastapi_dependency_answers_401_and_400() -> None:
    with TestClient(create_app(NEW)) as client:
        body, headers = signed(envelope(), (OTHER,))
        assert client.post("/hook", content=body, headers=headers).status_code == 401
        body, headers = signed({"not": "an envelope"}, (NEW,))
        assert client.post("/hook", content=body, headers=headers).status_code == 400
        body, headers = signed(envelope(), (NEW,))
        assert client.post("/hook", content=body, headers=headers).status_code == 204
        assert client.post("/hook", content=body, headers=headers).status_code == 204  # a redelivery
        assert [m["offset"] for m in client.get("/received").json()] == [0]
        body, headers = signed({**envelope(1), "value": None, "value_b64": "AP8=", "format": "binary"}, (NEW,),
                               "msg_orders_1_1")
        assert client.post("/hook", content=body, headers=headers).status_code == 204
        assert client.get("/received").json()[-1]["value_b64"] == "AP8="


# -- real deliveries ---------------------------------------------------------------------------
@pytest.fixture
def receivers() -> Iterator[tuple[AppThread, AppThread]]:
    single, batched = AppThread(create_app([OLD, NEW])), AppThread(create_app(OLD))
    single.start()
    batched.start()
    yield single, batched
    single.stop()
    batched.stop()


def deliveries(receiver: AppThread) -> list[Delivery]:
    return list(receiver.server.config.app.state.deliveries)  # the FastAPI app behind uvicorn


def wait_for(predicate: Any, timeout: float = 60) -> None:
    eventually(predicate, timeout, interval=0.1)


def test_real_deliveries_verify_and_forgeries_get_401(broker: Broker, receivers: tuple[AppThread, AppThread]) -> None:
    single, batched = receivers
    topic = broker.create_topic("w-orders", partitions=2)
    with Producer(broker.url, broker.token) as p:
        futures = [p.send(topic, {"n": i}, key=f"k{i}", ack="table") for i in range(6)]
        sent = {(r.partition, r.offset): {"n": i} for i, r in enumerate(f.result(timeout=30) for f in futures)}
    with broker.admin() as admin:
        for name, url, sub_secret, batch_size in (("w-single", single.url, NEW, 1),
                                                  ("w-batch", batched.url, OLD, 10)):
            r = admin.post("/v1/subscriptions", json={
                "name": name, "topic": topic, "url": url + "/hook", "start": "earliest", "secret": sub_secret,
                "batch_size": batch_size, "retry_schedule_s": [0.2]})
            assert r.status_code == 201, r.text

    wait_for(lambda: sum(len(d.messages) for d in deliveries(single)) >= 6)
    wait_for(lambda: sum(len(d.messages) for d in deliveries(batched)) >= 6)

    got = deliveries(single)
    assert all(not d.batch for d in got)
    assert {(d.message.partition, d.message.offset): d.message.value for d in got} == sent
    assert {d.id for d in got} == {f"msg_{topic}_{p}_{o}" for p, o in sent}
    assert all(d.message.topic == topic and d.message.key is not None for d in got)

    batches = deliveries(batched)
    assert all(d.batch for d in batches) and max(len(d.messages) for d in batches) > 1
    assert {(m.partition, m.offset): m.value for d in batches for m in d.messages} == sent

    count = len(deliveries(single))
    forged_body, forged_headers = signed(envelope(), (OTHER,))
    r = httpx.post(single.url + "/hook", content=forged_body, headers=forged_headers)
    assert r.status_code == 401
    assert httpx.post(single.url + "/hook", json=envelope()).status_code == 401  # unsigned
    assert len(deliveries(single)) == count, "a forgery never reaches the handler"
