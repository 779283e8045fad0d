"""Every front door gives the same outcome for the same produce, each in its own wire form.

One table of cases, run through every door against real `lakebroker serve` processes: a single
message answered below ASGI (the fast path) and through ASGI (`fast_produce` off), a JSON batch,
an NDJSON batch, an Arrow IPC batch, Confluent's REST Proxy v2 and v3, and Kafka's protocol (a
produce request on a SASL-authenticated connection); then backpressure, and a partition between
owners, on servers of their own. Each door answers in its own terms: REST Proxy v2 and v3 in
Confluent's `error_code`s (a record's own fault is that record's slot or result, not the
request's), Kafka in its error codes. A rule copied into one door and missed in another shows here as a door that
answers differently.
"""

from __future__ import annotations

import os
import signal
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow as pa
import pytest
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from lakebroker.ingest_api.partitioner import partition_for_key
from lakebroker.tables.layout import Layout
from lakebroker.tables.tokens import TokenStore
from tests.kafka_wire import KafkaConnection, partition_answer, produce, record_batch
from tests.servers import ServerProcess, until

pytestmark = [pytest.mark.timeout(300)]

PARTITIONS = 4
MAX_MESSAGE_BYTES = 1_000
ARROW = "application/vnd.apache.arrow.stream"
V2_JSON = "application/vnd.kafka.json.v2+json"


@dataclass(frozen=True)
class Outcome:
    """A door's answer to one message, in common terms: stored (partition, offset, duplicate) or
    refused (the HTTP status, our error code, and whether the producer may retry as it is)."""

    status: int
    code: str | None = None  # refused: our error code (v2's error_code, for the REST Proxy door)
    partition: int | None = None
    offset: int | None = None
    duplicate: bool = False
    retry_after: str | None = None


@dataclass(frozen=True)
class Server:
    url: str
    admin: str  # an admin token's header value
    narrow: str  # a produce token for the topic `other` alone
    kafka: str = ""  # host:port of its Kafka listener


def _server(tmp_path_factory: pytest.TempPathFactory, name: str, **env: str) -> Iterator[Server]:
    root = tmp_path_factory.mktemp(name)
    node = ServerProcess(root / "data", {"LAKEBROKER_AUTH": "required", **env})
    tokens = TokenStore(Layout(root / "data"))
    _, admin = tokens.create(["admin"], name="admin")
    _, narrow = tokens.create(["produce"], topics=["other"], name="narrow")
    try:
        node.start()
        server = Server(node.url, f"Bearer {admin}", f"Bearer {narrow}", node.kafka)
        for topic in ("t", "other"):
            r = httpx.post(f"{server.url}/v1/topics", headers={"authorization": server.admin}, timeout=30,
                           json={"name": topic, "partitions": PARTITIONS, "max_message_bytes": MAX_MESSAGE_BYTES})
            assert r.status_code == 201, r.text
        yield server
    finally:
        node.stop()


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _server(tmp_path_factory, "fast")


@pytest.fixture(scope="module")
def asgi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _server(tmp_path_factory, "asgi", LAKEBROKER_FAST_PRODUCE="false")


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A backlog limit of one byte and no flush for an hour: past its first message, every produce
    meets backpressure."""
    yield from _server(tmp_path_factory, "full", LAKEBROKER_MAX_BACKLOG_BYTES="1",
                       LAKEBROKER_FLUSH_INTERVAL_MS="3600000")


# -- the doors: each sends one message (a dict in the JSON batch's form) and reads its outcome ----------
def _ours(r: httpx.Response, one: Callable[[dict[str, Any]], dict[str, Any]]) -> Outcome:
    body = orjson.loads(r.content)
    if r.status_code != 200:
        return Outcome(r.status_code, body["error"]["code"], retry_after=r.headers.get("retry-after"))
    placed = one(body)
    return Outcome(200, None, placed["partition"], placed["offset"], placed["duplicate"])


def _single(server: Server, topic: str, m: dict[str, Any], auth: str, raw: bytes | None) -> Outcome:
    r = httpx.post(f"{server.url}/v1/topics/{topic}/messages", params={"ack": "wal"}, timeout=30,
                   content=raw if raw is not None else orjson.dumps(m),
                   headers={"authorization": auth, "content-type": "application/json"})
    return _ours(r, lambda body: body)


def _batch(kind: str) -> Callable[[Server, str, dict[str, Any], str, bytes | None], Outcome]:
    def send(server: Server, topic: str, m: dict[str, Any], auth: str, raw: bytes | None) -> Outcome:
        if raw is not None:
            body = raw
        elif kind == "application/json":
            body = orjson.dumps({"messages": [m]})
        elif kind == "application/x-ndjson":
            body = orjson.dumps(m) + b"\n"
        else:
            body = _arrow(m)
        r = httpx.post(f"{server.url}/v1/topics/{topic}/batch", params={"ack": "wal"}, content=body, timeout=30,
                       headers={"authorization": auth, "content-type": kind})
        return _ours(r, lambda answer: answer["results"][0])

    return send


def _arrow(m: dict[str, Any]) -> bytes:
    columns: dict[str, pa.Array] = {"value": pa.array([m["value"]], pa.string())}
    if "key" in m:
        columns["key"] = pa.array([m["key"]], pa.string())
    if "partition" in m:
        columns["partition"] = pa.array([m["partition"]], pa.int64())
    if "id" in m:
        columns["id"] = pa.array([m["id"]], pa.string())
    if "headers" in m:
        columns["headers"] = pa.array([list(m["headers"].items())], pa.map_(pa.string(), pa.string()))
    table = pa.table(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _v2(server: Server, topic: str, m: dict[str, Any], auth: str, raw: bytes | None) -> Outcome:
    record = {k: v for k, v in m.items() if k in ("key", "value", "partition")}
    r = httpx.post(f"{server.url}/topics/{topic}", timeout=30,
                   content=raw if raw is not None else orjson.dumps({"records": [record]}),
                   headers={"authorization": auth, "content-type": V2_JSON})
    body = orjson.loads(r.content)
    if r.status_code != 200:
        return Outcome(r.status_code, str(body["error_code"]), retry_after=r.headers.get("retry-after"))
    slot = body["offsets"][0]
    if slot["error_code"] is not None:
        return Outcome(200, str(slot["error_code"]))  # the record's own fault, in its slot
    return Outcome(200, None, slot["partition"], slot["offset"], False)


def _v3(server: Server, topic: str, m: dict[str, Any], auth: str, raw: bytes | None) -> Outcome:
    record: dict[str, Any] = {"value": {"type": "JSON", "data": m.get("value")}}
    if "key" in m:
        record["key"] = {"type": "STRING", "data": m["key"]}
    if "partition" in m:
        record["partition_id"] = m["partition"]
    r = httpx.post(f"{server.url}/v3/clusters/lakebroker/topics/{topic}/records", timeout=30,
                   content=raw if raw is not None else orjson.dumps(record),
                   headers={"authorization": auth, "content-type": "application/json"})
    if r.status_code != 200:
        return Outcome(r.status_code, str(orjson.loads(r.content)["error_code"]),
                       retry_after=r.headers.get("retry-after"))
    [result] = [orjson.loads(line) for line in r.content.splitlines()]
    if result["error_code"] != 200:  # the record's own result; a stream has no Retry-After header
        wait = result.get("retry_after_s")
        return Outcome(200, str(result["error_code"]), retry_after=None if wait is None else str(wait))
    return Outcome(200, None, result["partition_id"], result["offset"])


def _kafka(server: Server, topic: str, m: dict[str, Any], auth: str, raw: bytes | None) -> Outcome:
    """A Produce request on a connection authenticated with the token as its SASL/PLAIN password. A
    Kafka client chooses the partition itself: the key's murmur2 one, as Kafka's producers do. An
    id becomes the producer's id and sequence, as an idempotent producer's retry carries them."""
    key = m.get("key")
    partition = m.get("partition", partition_for_key(key, PARTITIONS) if key is not None else 0)
    producer = {"producer_id": zlib.crc32(m["id"].encode()), "base_sequence": 0} if "id" in m else {}
    records = raw if raw is not None else record_batch(
        [str(m.get("value", "")).encode()], key=None if key is None else key.encode(),
        headers=tuple((k.encode(), str(v).encode()) for k, v in m.get("headers", {}).items()), **producer)
    with KafkaConnection(server.kafka) as kafka:
        assert kafka.call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        token = auth.removeprefix("Bearer ")
        assert kafka.call(SaslAuthenticateRequest(auth_bytes=b"\0\0" + token.encode())).error_code == 0
        answer = kafka.call(produce(topic, partition, records, acks=1))
    placed = partition_answer(answer)
    if placed.error_code != ErrorCode.none:
        throttled = answer.throttle_time.total_seconds()
        return Outcome(0, ErrorCode(placed.error_code).name, retry_after=str(round(throttled)) if throttled else None)
    return Outcome(200, None, partition, placed.base_offset)


Door = Callable[[Server, str, dict[str, Any], str, bytes | None], Outcome]
DOORS: dict[str, Door] = {
    "single": _single,
    "json": _batch("application/json"),
    "ndjson": _batch("application/x-ndjson"),
    "arrow": _batch(ARROW),
    "rest-v2": _v2,
    "rest-v3": _v3,
    "kafka": _kafka,
}
# A record's own fault (its size, its partition) through REST Proxy v2: that record's slot, not retriable.
RECORD_FAULT = "50002"


def _v2_form(expected: Outcome) -> Outcome:
    """A request's refusal through REST Proxy v2: its status, with Confluent's error_code."""
    return expected if expected.status == 200 else Outcome(expected.status, str(expected.status * 100 + 1))


def _v3_form(expected: Outcome) -> Outcome:
    """A request's refusal through REST Proxy v3: its status, which is also its error_code."""
    return expected if expected.status == 200 else Outcome(expected.status, str(expected.status))


@dataclass(frozen=True)
class Case:
    topic: str
    message: dict[str, Any]
    expected: Outcome  # in our own wire form; _v2_form gives the REST Proxy's
    raw: bytes | None = None  # a body sent as it is (the same bytes through every door)
    narrow: bool = False  # sent with the token for the topic `other` alone
    v2: Outcome | None = None  # the REST Proxy's outcome, where _v2_form does not tell it
    v3: Outcome | None = None  # REST Proxy v3's, where _v3_form does not tell it
    kafka: str | None = None  # Kafka's error code (None: produced)
    doors: tuple[str, ...] = tuple(DOORS)


KEY = "user-1"
CASES = {
    "a key's murmur2 partition": Case("t", {"key": KEY, "value": "v"}, Outcome(200, partition=partition_for_key(
        KEY, PARTITIONS))),
    "unknown topic": Case("nope", {"value": "v"}, Outcome(404, "not_found"), kafka="unknown_topic_or_partition"),
    "partition out of range": Case("t", {"value": "v", "partition": PARTITIONS}, Outcome(400, "invalid_request"),
                                   v2=Outcome(200, RECORD_FAULT), v3=Outcome(200, "400"),
                                   kafka="unknown_topic_or_partition"),
    "malformed body": Case("t", {}, Outcome(400, "invalid_request"), raw=b"{not json", kafka="corrupt_message",
                           v3=Outcome(200, "400"), doors=("single", "json", "ndjson", "rest-v2", "rest-v3", "kafka")),
    "value over the topic's limit": Case("t", {"value": "x" * (MAX_MESSAGE_BYTES + 1)}, Outcome(413, "too_large"),
                                         v2=Outcome(200, RECORD_FAULT), v3=Outcome(200, "413"),
                                         kafka="message_too_large"),
    "key over the topic's limit": Case("t", {"key": "k" * (MAX_MESSAGE_BYTES + 1), "value": "v"},
                                       Outcome(413, "too_large"), v2=Outcome(200, RECORD_FAULT),
                                       v3=Outcome(200, "413"), kafka="message_too_large"),
    "headers that are not strings": Case("t", {"value": "v", "headers": {"n": 1}}, Outcome(422, "invalid_request"),
                                         doors=("single", "json", "ndjson")),
    "a token without the topic": Case("t", {"value": "v"}, Outcome(403, "forbidden"), narrow=True,
                                      kafka="topic_authorization_failed"),
}


def _check(server: Server, name: str, case: Case) -> None:
    for door, send in DOORS.items():
        if door not in case.doors:
            continue
        got = send(server, case.topic, case.message, server.narrow if case.narrow else server.admin, case.raw)
        want = case.expected
        if door == "rest-v2":
            want = case.v2 or _v2_form(case.expected)
        if door == "rest-v3":
            want = case.v3 or _v3_form(case.expected)
        if door == "kafka":
            want = Outcome(200) if case.kafka is None else Outcome(0, case.kafka)
        if want.status == 200 and want.code is None:
            assert (got.status, got.code) == (200, None), (name, door, got)
            if want.partition is not None:
                assert got.partition == want.partition, (name, door, got)
        else:
            assert (got.status, got.code) == (want.status, want.code), (name, door, got)


@pytest.mark.parametrize("name", list(CASES))
def test_every_door_gives_the_same_outcome(name: str, fast: Server, asgi: Server) -> None:
    for server in (fast, asgi):  # the single door below ASGI, then through it
        _check(server, name, CASES[name])


def test_a_duplicate_id_answers_its_first_placement_through_every_door(fast: Server, asgi: Server) -> None:
    for server in (fast, asgi):
        for door, send in DOORS.items():
            if door in ("rest-v2", "rest-v3"):
                continue  # the REST Proxy's records carry no id
            message = {"value": "once", "id": f"dup-{door}-{server.url}"}
            first = send(server, "t", message, server.admin, None)
            again = send(server, "t", message, server.admin, None)
            assert first.status == 200 and not first.duplicate, (door, first)
            if door == "kafka":  # Kafka answers a producer's retry with its first offset, and no more
                assert (again.status, again.partition, again.offset) == (200, first.partition, first.offset), door
                continue
            assert (again.partition, again.offset, again.duplicate) == (first.partition, first.offset, True), door


def test_backpressure_is_a_429_with_retry_after_through_every_door(full: Server) -> None:
    first = _single(full, "t", {"value": "fills the backlog"}, full.admin, None)
    assert first.status == 200, first
    for door, send in DOORS.items():
        got = send(full, "t", {"value": "v"}, full.admin, None)
        # Kafka: a retriable error, and a throttle time the client waits out before it sends again
        want = {"rest-v2": Outcome(429, "42901"), "rest-v3": Outcome(200, "429"),  # v3: the record's result
                "kafka": Outcome(0, "request_timed_out")}.get(door, Outcome(429, "backpressure"))
        assert (got.status, got.code) == (want.status, want.code), (door, got)
        assert got.retry_after is not None and int(got.retry_after) >= 1, (door, got)


def test_a_partition_whose_owner_just_died_is_a_503_with_retry_after_through_every_door(tmp_path: Path) -> None:
    """Between owners: node b owned the partition and was killed, and its lease has not yet run out.
    Node a cannot hand b the message; every door answers 503 partition_unavailable with Retry-After
    (REST Proxy v2: 50301), so the producer retries and reaches the next owner."""
    env = {"LAKEBROKER_TABLES_URI": str(tmp_path / "tables"), "LAKEBROKER_INGEST_LEASE_TTL_S": "300",
           "LAKEBROKER_INGEST_HEARTBEAT_S": "0.3"}
    a, b = ServerProcess(tmp_path / "a", env), ServerProcess(tmp_path / "b", env)
    try:
        a.start()
        b.start()
        assert httpx.post(f"{a.url}/v1/topics", json={"name": "t", "partitions": PARTITIONS}, timeout=30).status_code \
            == 201
        until(lambda: set(_owners(a.url).values()) == {a.url, b.url}, "partitions on both nodes", timeout=60)
        of_b = sorted(p for p, url in _owners(a.url).items() if url == b.url)
        key = next(k for k in (f"k{i}" for i in range(10_000)) if partition_for_key(k, PARTITIONS) in of_b)
        assert b.proc is not None
        os.kill(b.proc.pid, signal.SIGKILL)
        b.proc.wait(timeout=30)
        server = Server(a.url, "Bearer unused", "Bearer unused", a.kafka)  # auth is off on loopback
        for door, send in DOORS.items():
            got = send(server, "t", {"key": key, "value": "v"}, server.admin, None)
            if door == "kafka":  # a Kafka client is never forwarded: it asks the metadata again and waits
                assert (got.status, got.code) == (0, "not_leader_or_follower"), got
                continue
            want = {"rest-v2": Outcome(503, "50301"), "rest-v3": Outcome(200, "503")}.get(
                door, Outcome(503, "partition_unavailable"))
            assert (got.status, got.code) == (want.status, want.code), (door, got)
            assert got.retry_after is not None and int(got.retry_after) >= 1, (door, got)
        assert set(_owners(a.url).values()) == {a.url, b.url}, "the lease of b ran out during the test"
    finally:
        a.stop()
        b.stop()


def _owners(url: str) -> dict[int, str | None]:
    r = httpx.get(f"{url}/v1/cluster", timeout=10)
    assert r.status_code == 200, r.text
    return {p["partition"]: p["url"] for p in r.json()["partitions"] if p["topic"] == "t"}
