"""Property-based API fuzzing with schemathesis, against the app's own OpenAPI schema.

Every operation gets generated requests, valid and invalid, sent in-process to an app with
auth required and an admin token, on a data dir holding a real topic with messages. Every
response must be documented (status code, content type, body schema), nothing may answer
5xx, and schemathesis's other default checks hold (e.g. invalid input is refused, a 405
carries `Allow`, a request without the token is refused).

One default check is left out: positive_data_acceptance, which wants every schema-valid
request accepted. Some rules no schema can state: a partition below the topic's partition
count, offsets inside the log, a webhook URL that resolves to a public address, a sequence
only with a producer_id. Those answer 400 by design.

NDJSON batch bodies are fuzzed as text (the schema declares them as a string).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.types import ASGIApp, Receive, Scope, Send

from lakebroker.server import build_app
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import TokenStore

# The suite's run is bounded (about a minute on 2 cores) and repeatable: the same examples each
# time. LAKEBROKER_FUZZ_EXAMPLES=300 explores further, with new random examples each run.
EXPLORE = "LAKEBROKER_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("LAKEBROKER_FUZZ_EXAMPLES", "25"))
TOPIC = "orders"
SUBSCRIPTION = "orders-hook"


def _settings(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir, auth="required", wal_fsync=False, flush_interval_ms=20,
                    deliver_in_serve=False, allow_private_webhooks=True, auth_cache_ms=60_000)


class CurrentApp:
    """The app of the running test: schemathesis (and its re-sending checks) call this one object."""

    app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.app is not None
        await self.app(scope, receive, send)


current = CurrentApp()
# The schema does not depend on the data dir; building the app touches no disk.
schema = schemathesis.openapi.from_dict(build_app(_settings(Path("unused"))).openapi())
schema.app = current
schemathesis.serializer.alias("application/x-ndjson", "text/plain")  # NDJSON batches are text


@functools.cache
def admin_token() -> tuple[Path, str]:
    """One token table, copied into each test's data dir: schemathesis may ask for the token
    before the test's fixture runs."""
    tokens = Path(tempfile.mkdtemp(prefix="lakebroker-fuzz-")) / "data"
    atexit.register(shutil.rmtree, tokens.parent, ignore_errors=True)
    _, token = TokenStore(Layout(tokens)).create(["admin"], name="fuzz")
    return Path(Layout(tokens).tokens_table), token


@schema.auth()
class AdminToken:
    """The admin token, given through schemathesis so its negative cases can leave it out."""

    def get(self, case: Any, context: Any) -> str:
        return admin_token()[1]

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[asgi.ASGIClient, dict[str, str]]]:
    """A fresh app and data dir per operation; schemathesis ends the app's lifespan after the test."""
    data = tmp_path / "data"
    table, token = admin_token()
    shutil.copytree(table, Layout(data).tokens_table)
    headers = {"Authorization": f"Bearer {token}"}
    current.app = build_app(_settings(data))
    with asgi.get_client(current) as client:
        assert client.post("/v1/topics", json={"name": TOPIC, "partitions": 3}, headers=headers).status_code == 201
        for i in range(6):
            r = client.post(f"/v1/topics/{TOPIC}/messages", params={"ack": "table"}, headers=headers,
                            json={"key": f"k{i}", "value": {"n": i}})
            assert r.status_code == 200, r.text
        r = client.post("/v1/subscriptions", headers=headers, json={
            "name": SUBSCRIPTION, "topic": TOPIC, "url": "http://127.0.0.1:9/hook", "start": "earliest"})
        assert r.status_code == 201, r.text
        yield client, headers


def _aim_at_real_data(case: Any) -> None:
    """Half the generated topic and subscription names become the real ones, so requests reach
    real partitions, messages and subscriptions, not only 404s.

    Which half is a pure function of the generated case, so Hypothesis can still shrink and replay.
    """
    path = case.meta.components.get(ParameterLocation.PATH) if case.meta else None
    if path is not None and path.mode.is_negative:
        return  # an invalid name on purpose: keep it
    params = case.path_parameters or {}
    if zlib.crc32(repr((sorted(params.items()), case.query, case.body)).encode()) % 2:
        return
    if "topic" in params:
        params["topic"] = TOPIC
    if "name" in params:
        params["name"] = SUBSCRIPTION
    if isinstance(params.get("partition"), int):
        params["partition"] = abs(params["partition"]) % 4  # 0-2 exist, 3 is out of range


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=not EXPLORE, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
def test_api_conforms_to_its_schema(case: Any, api: tuple[asgi.ASGIClient, dict[str, str]]) -> None:
    client, headers = api
    _aim_at_real_data(case)
    case.call_and_validate(session=client, excluded_checks=[positive_data_acceptance])
    if case.method == "DELETE":  # put back what the case deleted, for the rest of the examples
        if client.get(f"/v1/topics/{TOPIC}", headers=headers).status_code == 404:
            client.post("/v1/topics", json={"name": TOPIC, "partitions": 3}, headers=headers)
        if client.get(f"/v1/subscriptions/{SUBSCRIPTION}", headers=headers).status_code == 404:
            client.post("/v1/subscriptions", headers=headers, json={
                "name": SUBSCRIPTION, "topic": TOPIC, "url": "http://127.0.0.1:9/hook", "start": "earliest"})


# -- what the fuzzer found, pinned (each answered 500, or worse, before its fix) -------------------
@pytest.fixture
def plain(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path / "data", wal_fsync=False, flush_interval_ms=20, deliver_in_serve=False,
                        allow_private_webhooks=True)
    with TestClient(build_app(settings), raise_server_exceptions=False) as client:
        assert client.post("/v1/topics", json={"name": TOPIC, "partitions": 3}).status_code == 201
        yield client


def test_integers_out_of_range_or_of_the_wrong_type_are_refused(plain: TestClient) -> None:
    for body in ({"retention_bytes": 2**70}, {"retention_ms": 2**63}, {"tombstone_retention_ms": False},
                 {"partitions": True}, {"retention_ms": 5.5}):
        assert plain.post("/v1/topics", json={"name": "t", **body}).status_code == 422, body
    for body in ({"partitions": None}, {"max_message_bytes": None}, {"tombstone_retention_ms": None},
                 {"cleanup_policy": None}, {"retention_bytes": 2**70}):
        assert plain.patch(f"/v1/topics/{TOPIC}", json=body).status_code == 422, body
    assert plain.patch(f"/v1/topics/{TOPIC}", json={"retention_ms": None}).json()["retention_ms"] is None
    for body in ({"value": 1, "producer_id": "p", "sequence": 2**70}, {"value": 1, "partition": True}):
        assert plain.post(f"/v1/topics/{TOPIC}/messages", json=body).status_code == 422, body
    for query in ("sequence=99999999999999999999&producer_id=p", "partition=%C2%B2", "partition=5000", "id="):
        r = plain.post(f"/v1/topics/{TOPIC}/messages?{query}", content=b"raw",
                       headers={"content-type": "application/octet-stream"})
        assert r.status_code == 400, (query, r.text)


def test_json_numbers_a_float_cannot_hold_are_refused_not_stored_as_null(plain: TestClient) -> None:
    for raw in (b'{"value": 1e400}', b'{"value": [1, {"a": -1e400}]}', b'{"value": 123456789012345678901234567890}'):
        r = plain.post(f"/v1/topics/{TOPIC}/messages", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
    r = plain.post(f"/topics/{TOPIC}", content=b'{"records": [{"value": 1e400}]}',
                   headers={"content-type": "application/vnd.kafka.json.v2+json"})
    assert r.status_code == 200 and r.json()["offsets"][0]["error_code"] == 50002  # that record is refused
    assert all(p["log_end_offset"] == 0 for p in plain.get(f"/v1/topics/{TOPIC}").json()["partition_offsets"])
    assert plain.post(f"/v1/topics/{TOPIC}/messages", json={"value": [1.5, None]}).status_code == 200


def test_timestamps_beyond_any_date_are_refused(plain: TestClient) -> None:
    for ts in ("99999999999999999999", "-99999999999999999", "²", "9999-12-31T23:59:59-14:00"):
        r = plain.get(f"/v1/topics/{TOPIC}/partitions/0/messages", params={"timestamp": ts})
        assert r.status_code == 400, (ts, r.text)
    assert plain.get(f"/v1/topics/{TOPIC}/partitions/0/messages", params={"timestamp": "0"}).status_code == 200


def test_raw_body_fields_in_the_query_of_a_json_body_are_refused(plain: TestClient) -> None:
    r = plain.post(f"/v1/topics/{TOPIC}/messages", params={"partition": 2}, json={"value": 1})
    assert r.status_code == 400 and "octet-stream" in r.json()["error"]["message"]


def test_405_lists_every_method_of_the_path(plain: TestClient) -> None:
    r = plain.put("/v1/topics")
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    r = plain.post(f"/v1/topics/{TOPIC}")
    assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET, PATCH"


def test_subscription_fields_cannot_be_nulled(plain: TestClient) -> None:
    r = plain.post("/v1/subscriptions", json={"name": "s", "topic": TOPIC, "url": "http://127.0.0.1:9/x"})
    assert r.status_code == 201, r.text
    for body in ({"ordering": None}, {"url": None}, {"max_in_flight": None}, {"batch_size": True}):
        assert plain.patch("/v1/subscriptions/s", json=body).status_code == 422, body
    assert plain.post("/v1/subscriptions/s/dead-letters/replay", json={"from_offset": False}).status_code == 422


def test_every_reference_in_the_schema_resolves(plain: TestClient) -> None:
    document = plain.get("/openapi.json").json()

    def refs(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    found = list(refs(document))
    assert found
    for ref in found:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in document["components"]["schemas"], ref
