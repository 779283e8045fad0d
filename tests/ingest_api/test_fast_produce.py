"""The fast produce path (ingest_api/fast_produce.py, answered by ingest_api/http_fast_produce.py) answers
exactly as the ASGI path does: two servers on loopback, one with the fast path and one without,
get the same raw requests in the same order and must answer the same bytes (the date aside) and
hold the same rows in Delta."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from deltalake import DeltaTable
from fastapi import FastAPI

from lakebroker.ingest_api.fast_produce import FastProduce
from lakebroker.ingest_api.http_fast_produce import fast_protocol
from lakebroker.ingest_api.http_limits import bounded_protocol
from lakebroker.ingest_api.node import IngestNode
from lakebroker.ingest_api.wal import ZERO_AHEAD
from lakebroker.server import build_app
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import TokenStore
from tests.full_disk import fill
from tests.servers import AppThread
from tests.waiting import eventually

Address = tuple[str, int]
BODY = b'{"key":"user-1","value":"hello world 0123456789 0123456789 0123456789 0123456789"}'
MAX_REQUEST = 4096
_DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")
_TOKEN_ID = re.compile(rb"\b[0-9a-f]{12}\b")  # each server has its own tokens, named in a 403's message


class Server:
    """`build_app` under uvicorn (httptools, uvloop) in a thread, with or without the fast path."""

    def __init__(self, data: Path, fast: bool, timeout_keep_alive: float = 5, **overrides: object) -> None:
        self.settings = Settings(**{"data_dir": data, "flush_interval_ms": 20, "deliver_in_serve": False,
                                    "max_request_bytes": MAX_REQUEST, "body_read_timeout_s": 1, **overrides})
        node = IngestNode.build(self.settings)
        self.app: FastAPI = build_app(self.settings, node=node)
        self.fast = FastProduce(node, self.app) if fast else None
        # log_config=None, as `serve` runs it: uvicorn leaves logging alone, so its access log stays off
        http = fast_protocol(10.0, self.fast) if self.fast is not None else bounded_protocol(10.0)
        self.thread = AppThread(self.app, http=http, loop="uvloop", lifespan="on",
                                log_config=None, timeout_keep_alive=timeout_keep_alive)

    def start(self) -> Server:
        url = self.thread.start()
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.address = (host, int(port))
        return self

    @property
    def taken(self) -> int:
        return 0 if self.fast is None else self.fast.taken

    def flushed(self, topic: str) -> bool:
        broker = self.app.state.broker
        config = broker.topics[topic]
        return all(broker.committed_end(config, p) == broker.assigned_end(config, p) for p in range(config.partitions))

    def rows(self, topic: str) -> list[tuple[object, ...]]:
        table = DeltaTable(str(Layout.of(self.settings).topic_table(topic))).to_pyarrow_table()
        names = ["partition", "offset", "key", "value", "headers", "message_id", "producer_id", "sequence"]
        return sorted(zip(*(table.column(n).to_pylist() for n in names), strict=True))

    def stop(self) -> None:
        self.thread.stop()


def request(path: str, body: bytes = BODY, token: str | None = None, content_type: str = "application/json",
            extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    head = b"POST %s HTTP/%s\r\nHost: x\r\n" % (path.encode(), version)
    if content_type:
        head += b"Content-Type: %s\r\n" % content_type.encode()
    if token:
        head += b"Authorization: Bearer %s\r\n" % token.encode()
    return head + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


def read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """`count` whole responses (content-length bodies) from a connection, then a check that it is idle."""
    sock.settimeout(30)
    data, out = b"", []
    while len(out) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, (out, data)
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, (out, data)
            rest += chunk
        out.append(head + b"\r\n\r\n" + rest[:length])
        data = rest[length:]
    assert data == b"", "nothing may follow the answers"
    return out


def until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


def exchange(address: Address, *sends: bytes, answers: int = 1) -> list[bytes]:
    with socket.create_connection(address) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for data in sends:
            sock.sendall(data)
        return read_responses(sock, answers)


def undated(answer: bytes) -> bytes:
    assert _DATE.search(answer), answer  # uvicorn's default headers, on both paths
    return _DATE.sub(b"\r\ndate: -\r\n", answer)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> dict[str, object]:
    parsed: dict[str, object] = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    return parsed


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Both servers' data dirs hold the same tokens (a token table per data dir)."""
    root = tmp_path_factory.mktemp("fast")
    made: dict[str, str] = {}
    for name in ("fast", "asgi"):
        store = TokenStore(Layout(root / name))
        for label, scopes, topics in (("admin", ["admin"], []), ("produce", ["produce"], []),
                                      ("consume", ["consume"], []), ("other_only", ["produce"], ["other"])):
            token = store.create(scopes, topics=topics, name=label)[1]
            made[f"{name}:{label}"] = token
    return root, made


Pair = tuple[Server, Server, Callable[[str, str], str]]


@pytest.fixture(scope="module")
def pair(tokens: tuple[Path, dict[str, str]]) -> Iterator[Pair]:
    """Auth required, with the token table cached long enough that the fast path decides every request."""
    root, made = tokens
    servers = [Server(root / name, fast=name == "fast", auth="required", auth_cache_ms=600_000).start()
               for name in ("fast", "asgi")]
    try:
        for server, name in zip(servers, ("fast", "asgi"), strict=True):
            for topic, partitions in (("t", 2), ("other", 1)):
                create = orjson.dumps({"name": topic, "partitions": partitions})
                answer = exchange(server.address, request("/v1/topics", create, made[f"{name}:admin"]))[0]
                assert status_of(answer) == 201, answer
        yield servers[0], servers[1], lambda server, label: made[f"{server}:{label}"]
    finally:
        for server in servers:
            server.stop()


def both(pair: Pair, build: Callable[[str], list[bytes]], answers: int = 1) -> tuple[list[bytes], list[bytes]]:
    """The same requests (built per server, for its tokens) to the fast server, then to the ASGI one."""
    fast, asgi, _ = pair
    return exchange(fast.address, *build("fast"), answers=answers), exchange(asgi.address, *build("asgi"),
                                                                              answers=answers)


def _many_headers(n: int) -> bytes:
    return b"".join(b"X-H%d: v\r\n" % i for i in range(n))


# (name, path, body, token label, content type, extra header bytes, expected status)
CASES: list[tuple[str, str, bytes, str | None, str, bytes, int]] = [
    ("ack none", "/v1/topics/t/messages?ack=none", BODY, "produce", "application/json", b"", 202),
    ("ack wal", "/v1/topics/t/messages", BODY, "produce", "application/json", b"", 200),
    ("ack table", "/v1/topics/t/messages?ack=table", BODY, "produce", "application/json", b"", 200),
    ("keyless", "/v1/topics/t/messages?ack=wal", b'{"value":{"n":1},"headers":{"h":"1"}}', "produce",
     "application/json; charset=utf-8", b"", 200),
    ("id", "/v1/topics/t/messages", b'{"id":"m-1","value":"first"}', "produce", "application/json", b"", 200),
    ("duplicate id", "/v1/topics/t/messages", b'{"id":"m-1","value":"again"}', "produce", "application/json", b"",
     200),
    ("duplicate id, ack none", "/v1/topics/t/messages?ack=none", b'{"id":"m-1","value":"again"}', "produce",
     "application/json", b"", 202),
    ("producer sequence", "/v1/topics/t/messages", b'{"producer_id":"p","sequence":3,"value":"s"}', "produce",
     "application/json", b"", 200),
    ("raw bytes", "/v1/topics/t/messages?key=k&id=raw-1&partition=1", b"\x00\xffraw", "produce",
     "application/octet-stream", b"", 200),
    ("raw producer", "/v1/topics/t/messages?producer_id=p2&sequence=7", b"bytes", "produce",
     "application/octet-stream", b"", 200),
    ("raw bad partition", "/v1/topics/t/messages?partition=9", b"bytes", "produce", "application/octet-stream", b"",
     400),
    ("malformed json", "/v1/topics/t/messages", b'{"value": ', "produce", "application/json", b"", 400),
    ("empty body", "/v1/topics/t/messages", b"", "produce", "application/json", b"", 400),
    ("wrong shape", "/v1/topics/t/messages", b'{"valu": 1}', "produce", "application/json", b"", 422),
    ("query field with json", "/v1/topics/t/messages?partition=1", BODY, "produce", "application/json", b"", 400),
    ("bad ack", "/v1/topics/t/messages?ack=bad", BODY, "produce", "application/json", b"", 422),
    ("unknown topic", "/v1/topics/nope/messages", BODY, "produce", "application/json", b"", 404),
    ("invalid topic name", "/v1/topics/bad!name/messages", BODY, "produce", "application/json", b"", 400),
    ("unsupported type", "/v1/topics/t/messages", BODY, "produce", "text/plain", b"", 415),
    ("no content type", "/v1/topics/t/messages", BODY, "produce", "", b"", 415),
    ("body over max_request_bytes", "/v1/topics/t/messages", b"x" * (MAX_REQUEST + 1), "produce",
     "application/json", b"", 413),
    ("too many headers", "/v1/topics/t/messages", BODY, "produce", "application/json", _many_headers(101), 431),
    ("headers too large", "/v1/topics/t/messages", BODY, "produce", "application/json",
     b"X-Big: " + b"a" * 17_000 + b"\r\n", 431),
    ("no token", "/v1/topics/t/messages", BODY, None, "application/json", b"", 401),
    ("unknown token", "/v1/topics/t/messages", BODY, "lbk_nope", "application/json", b"", 401),
    ("token without produce scope", "/v1/topics/t/messages", BODY, "consume", "application/json", b"", 403),
    ("token for another topic", "/v1/topics/t/messages", BODY, "other_only", "application/json", b"", 403),
    ("token for this topic", "/v1/topics/other/messages", BODY, "other_only", "application/json", b"", 200),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fast_answers_as_asgi(pair: Pair, case: tuple[str, str, bytes, str | None, str, bytes, int]) -> None:
    _, path, body, label, content_type, extra, status = case
    fast, _, token = pair
    taken = fast.taken

    def build(server: str) -> list[bytes]:
        known = label in ("produce", "consume", "other_only", "admin")
        return [request(path, body, token(server, label) if known and label else label, content_type, extra)]

    (answer,), (expected,) = both(pair, build)
    assert fast.taken == taken + 1, (answer, expected)
    assert status_of(answer) == status, answer
    assert _TOKEN_ID.sub(b"-", undated(answer)) == _TOKEN_ID.sub(b"-", undated(expected))


def test_closing_answers_match(pair: Pair) -> None:
    """Connection: close and HTTP/1.0 get `connection: close` and the connection closed, on both paths."""
    fast, asgi, token = pair
    for extra, version in ((b"Connection: close\r\n", b"1.1"), (b"", b"1.0")):
        answers = []
        for server, name in ((fast, "fast"), (asgi, "asgi")):
            with socket.create_connection(server.address) as sock:
                sock.sendall(request("/v1/topics/t/messages", token=token(name, "produce"), extra=extra,
                                     version=version))
                answers.append(until_closed(sock))
        assert b"\r\nconnection: close\r\n" in answers[0], answers[0]
        assert status_of(answers[0]) == 200
        assert undated(answers[0]) == undated(answers[1])


def test_pipelined_requests_are_answered_in_order(pair: Pair) -> None:
    """Several requests in one write: a fast one first, then produce and other requests queued behind it
    (uvicorn's pipeline) and answered in request order."""

    def build(server: str) -> list[bytes]:
        produce = pair[2](server, "produce")
        ordered = [request(f"/v1/topics/t/messages?ack={ack}", orjson.dumps({"key": "p", "value": str(i)}), produce)
                   for i, ack in enumerate(("wal", "table", "none", "wal"))]
        return [ordered[0] + ordered[1] + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + ordered[2] + ordered[3]]

    fast_answers, asgi_answers = both(pair, build, answers=5)
    assert [undated(a) for a in fast_answers] == [undated(a) for a in asgi_answers]
    offsets = [body_of(a)["offset"] for a in fast_answers if b'"partition"' in a]
    assert offsets[0] is not None and offsets[1] == offsets[0] + 1 and offsets[2] is None  # ack none: not yet placed
    assert status_of(fast_answers[2]) == 200 and b"ok" in fast_answers[2]


def test_body_split_over_writes(pair: Pair) -> None:
    def build(server: str) -> list[bytes]:
        whole = request("/v1/topics/t/messages", orjson.dumps({"key": "split", "value": "v" * 300}),
                        pair[2](server, "produce"))
        head_end = whole.index(b"\r\n\r\n") + 4
        return [whole[:head_end], whole[head_end:head_end + 10], whole[head_end + 10:head_end + 100],
                whole[head_end + 100:]]

    taken = pair[0].taken
    (answer,), (expected,) = both(pair, build)
    assert pair[0].taken == taken + 1
    assert status_of(answer) == 200
    assert undated(answer) == undated(expected)


def test_a_body_that_never_completes_gets_408_and_is_closed(pair: Pair) -> None:
    """setting body_read_timeout_s (1 s here) holds on the fast path: 408, then the connection closes."""
    fast, asgi, token = pair
    answers = []
    taken = fast.taken
    for server, name in ((fast, "fast"), (asgi, "asgi")):
        whole = request("/v1/topics/t/messages", BODY, token(name, "produce"))
        with socket.create_connection(server.address) as sock:
            sock.sendall(whole[:-10])
            answers.append(until_closed(sock))
    assert fast.taken == taken + 1
    assert status_of(answers[0]) == 408, answers[0]
    assert b"body_read_timeout_s" in answers[0]
    assert undated(answers[0]) == undated(answers[1])


def test_a_client_that_leaves_while_waiting(tmp_path: Path) -> None:
    """A client gone before its WAL group (or Delta commit) is done: nothing is written to the closed
    connection, the message still lands, and the server goes on serving."""
    server = Server(tmp_path / "data", fast=True, auth="off").start()
    try:
        exchange(server.address, request("/v1/topics", b'{"name":"t","partitions":1}'))
        broker = server.app.state.broker
        topic_id = broker.topics["t"].topic_id
        for ack in ("wal", "table"):
            message = orjson.dumps({"id": f"left-{ack}", "value": "v"})
            with socket.create_connection(server.address) as sock:
                sock.sendall(request(f"/v1/topics/t/messages?ack={ack}", message))
            wait_for(lambda ack=ack: isinstance(broker.dedup.lookup((topic_id, f"m:left-{ack}")), tuple))
            (again,) = exchange(server.address, request(f"/v1/topics/t/messages?ack={ack}", message))
            assert status_of(again) == 200 and body_of(again)["duplicate"] is True, again
        assert server.taken == 4
        wait_for(lambda: server.flushed("t"))
        assert [row[5] for row in server.rows("t")] == ["left-wal", "left-table"]
    finally:
        server.stop()


def test_an_idle_connection_closes_after_the_keep_alive_timeout_counted_from_its_last_answer(
        tmp_path: Path) -> None:
    """uvicorn's keep-alive rule, kept by the protocol's single per-connection timer: a connection
    idle for timeout_keep_alive since its last answer is closed, on the fast path and through ASGI;
    one that sent another request in time is not (the timer armed at the first answer must not end it)."""
    server = Server(tmp_path / "data", fast=True, timeout_keep_alive=1, auth="off").start()
    try:
        exchange(server.address, request("/v1/topics", b'{"name":"t","partitions":1}'))
        for path in ("/v1/topics/t/messages", "/v1/topics/nope/batch"):  # fast path; ASGI (a 404)
            with socket.create_connection(server.address) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for _ in range(3):  # 0.7 s apart: each answer restarts the idle time
                    sock.sendall(request(path))
                    (answer,) = read_responses(sock, 1)
                    assert status_of(answer) in (200, 404), answer
                    time.sleep(0.7)
                last = time.monotonic() - 0.7
                assert until_closed(sock) == b""  # closed by the server, with nothing more said
                idle = time.monotonic() - last
                assert 0.9 <= idle <= 3.0, f"closed {idle:.2f} s after the last answer (timeout 1 s)"
        assert server.taken == 3  # the three produce requests (the create and the 404s went through ASGI)
    finally:
        server.stop()


def test_a_stale_token_cache_takes_the_asgi_path(tmp_path: Path) -> None:
    """With the token table due for a read, the fast path hands the request to ASGI, which reads it."""
    data = tmp_path / "data"
    admin = TokenStore(Layout(data)).create(["admin"], name="admin")[1]
    server = Server(data, fast=True, auth="required", auth_cache_ms=0).start()
    try:
        (made,) = exchange(server.address, request("/v1/topics", b'{"name":"t","partitions":1}', admin))
        assert status_of(made) == 201, made
        (answer,) = exchange(server.address, request("/v1/topics/t/messages", token=admin))
        assert status_of(answer) == 200, answer
        assert server.taken == 0
        (refused,) = exchange(server.address, request("/v1/topics/t/messages"))  # no token: decided at once
        assert status_of(refused) == 401 and server.taken == 1
    finally:
        server.stop()


def test_backlog_429_matches(tmp_path: Path) -> None:
    """Over max_backlog_bytes (nothing flushed for a minute here) both paths answer 429 with Retry-After."""
    servers = [Server(tmp_path / name, fast=name == "fast", auth="off", max_backlog_bytes=1,
                      flush_interval_ms=60_000).start() for name in ("fast", "asgi")]
    try:
        answers = []
        for server in servers:
            exchange(server.address, request("/v1/topics", b'{"name":"t","partitions":1}'))
            (first,) = exchange(server.address, request("/v1/topics/t/messages"))
            (second,) = exchange(server.address, request("/v1/topics/t/messages"))
            assert status_of(first) == 200, first
            answers.append(second)
        assert status_of(answers[0]) == 429 and b"\r\nretry-after: 1\r\n" in answers[0], answers[0]
        assert servers[0].taken == 2
        assert undated(answers[0]) == undated(answers[1])
    finally:
        for server in servers:
            server.stop()


def test_shutdown_lets_a_fast_request_finish(tmp_path: Path) -> None:
    """Graceful shutdown while a fast request's body is still arriving: the request is answered (with
    connection: close), then the connection is closed and the server stops."""
    server = Server(tmp_path / "data", fast=True, auth="off").start()
    try:
        exchange(server.address, request("/v1/topics", b'{"name":"t","partitions":1}'))
        whole = request("/v1/topics/t/messages?ack=wal")
        connections = server.thread.server.server_state.connections

        def shut_down_in_flight() -> bool:  # uvicorn's shutdown() has reached the request in progress
            pending = [c for c in connections if c.cycle is not None and not c.cycle.response_complete]
            return len(pending) == 1 and not pending[0].cycle.keep_alive

        with socket.create_connection(server.address) as sock:
            sock.sendall(whole[:-5])
            wait_for(lambda: server.taken == 1)
            server.thread.server.should_exit = True
            wait_for(shut_down_in_flight)
            sock.sendall(whole[-5:])
            answer = until_closed(sock)
        assert status_of(answer) == 200 and b"\r\nconnection: close\r\n" in answer, answer
        server.thread.thread.join(timeout=30)
        assert not server.thread.thread.is_alive()
    finally:
        server.stop()


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    eventually(condition, timeout, interval=0.01)


def test_delta_rows_match(pair: Pair) -> None:
    """Last in this module: every request above left the same rows in both servers' tables."""
    fast, asgi, _ = pair
    for topic in ("t", "other"):
        wait_for(lambda topic=topic: fast.flushed(topic) and asgi.flushed(topic))  # type: ignore[misc]
        assert fast.rows(topic) == asgi.rows(topic)
    assert len(fast.rows("t")) > 10


def chunked(path: str, body: bytes) -> bytes:
    """A produce request with a chunked body: the fast path leaves it to ASGI."""
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            % path.encode() + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")


@pytest.mark.fault
def test_a_full_disk_answers_507_on_both_paths(tmp_path: Path) -> None:
    """The WAL's disk full: the fast path's 507 is the ASGI path's (a chunked request, on the same server)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], check=True)
    try:
        server = Server(disk / "data", fast=True, auth="off", max_request_bytes=1 << 20).start()
        try:
            exchange(server.address, request("/v1/topics", b'{"name":"t","partitions":1}'))
            ballast = disk / "ballast"
            fill(ballast)
            big = orjson.dumps({"value": "x" * 100_000})
            for _ in range(ZERO_AHEAD // 100_000 + 2):  # the WAL's room zeroed ahead still takes a few
                (answer,) = exchange(server.address, request("/v1/topics/t/messages", big))
                if status_of(answer) != 200:
                    break
            taken = server.taken
            (asgi,) = exchange(server.address, chunked("/v1/topics/t/messages", big))
            assert server.taken == taken
            (fast,) = exchange(server.address, request("/v1/topics/t/messages", big))
            assert server.taken == taken + 1
            assert status_of(fast) == 507 and b"disk full" in fast, fast
            assert undated(fast) == undated(asgi)
            ballast.unlink()
            (after,) = exchange(server.address, request("/v1/topics/t/messages?ack=table", BODY))
            assert status_of(after) == 200, after
        finally:
            server.stop()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)
