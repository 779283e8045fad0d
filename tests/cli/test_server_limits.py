"""HTTP request limits of `lakebroker serve` (httptools on uvloop), over raw sockets: the bound on
a request head (431), the exact header count and size (431), the deadline for a request head (408
or a plain close), and that keep-alive and pipelining still work beside them."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from lakebroker.ingest_api.limits import MAX_HEADER_BYTES
from tests.servers import ServerProcess

Address = tuple[str, int]
NO_JOBS = {f"LAKEBROKER_{job}_INTERVAL_S": "0" for job in ("COMPACTION", "RETENTION", "KEY_COMPACTION",
                                                            "OFFSETS_COMPACTION", "REPLICATION")}


def recv_all(sock: socket.socket, timeout: float = 30) -> bytes:
    """Everything the server sends until it closes the connection (or `timeout` passes)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except TimeoutError:
        out += b"<still open>"
    except ConnectionResetError:
        out += b"<reset>"
    return out


def send_request_head(address: Address, head: bytes) -> bytes:
    with socket.create_connection(address) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed on us mid-send
            sock.sendall(head)
        return recv_all(sock)


def trickle(address: Address, data: bytes, chunk: int = 1) -> bytes:
    """Sends `data` `chunk` bytes per segment (no Nagle), stopping once the server answers or closes;
    returns what it answered."""
    with socket.create_connection(address) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for at in range(0, len(data), chunk):
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.send(data[at:at + chunk])
            except (BrokenPipeError, ConnectionResetError):
                break
        return recv_all(sock)


def read_response(sock: socket.socket) -> bytes:
    """One whole response (head and a content-length body) from a keep-alive connection."""
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    assert len(body) == length, "nothing may follow the response"
    return head + b"\r\n\r\n" + body


def read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """`count` whole responses (content-length bodies) that may arrive in the same reads."""
    sock.settimeout(30)
    data, out = b"", []
    while len(out) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            length = int(data[:end].lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            if len(data) >= end + 4 + length:
                out.append(data[: end + 4 + length])
                data = data[end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    assert data == b"", "nothing may follow the responses"
    return out


def error_code(answer: bytes) -> str:
    body = answer.split(b"\r\n\r\n", 1)[1].removesuffix(b"<reset>")
    code: str = orjson.loads(body)["error"]["code"]
    return code


def start_server(data_dir: Path, **env: str) -> tuple[ServerProcess, Address]:
    proc = ServerProcess(data_dir, env={"LAKEBROKER_DELIVER_IN_SERVE": "false", **NO_JOBS, **env})
    url = proc.start()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    httpx.post(url + "/v1/topics", json={"name": "t", "partitions": 1}).raise_for_status()
    return proc, (host, int(port))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Address]]:
    proc, address = start_server(tmp_path_factory.mktemp("limits") / "data")
    try:
        yield proc, address
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def server(served: tuple[ServerProcess, Address]) -> Address:
    return served[1]


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Address]:
    """A server whose request heads must arrive within 1 s and bodies within 3 s (settings
    header_read_timeout_s and body_read_timeout_s)."""
    proc, address = start_server(tmp_path_factory.mktemp("quick") / "data", LAKEBROKER_HEADER_READ_TIMEOUT_S="1",
                                 LAKEBROKER_BODY_READ_TIMEOUT_S="3")
    try:
        yield address
    finally:
        proc.stop()


def still_serves(address: Address) -> None:
    url = f"http://{address[0]}:{address[1]}"
    assert httpx.get(url + "/healthz").status_code == 200
    produced = httpx.post(url + "/v1/topics/t/messages?ack=wal", json={"key": "k", "value": "v"})
    assert produced.status_code == 200, produced.text


def produce_request(value: str = "v", close: bool = False) -> bytes:
    body = orjson.dumps({"key": "k", "value": value})
    return (b"POST /v1/topics/t/messages?ack=wal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + (b"Connection: close\r\n" if close else b"") + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def test_serve_runs_httptools_on_uvloop(served: tuple[ServerProcess, Address]) -> None:
    started = served[0].log.read_text()
    protocol = "HTTP protocol lakebroker.ingest_api.http_fast_produce.FastProduceProtocol (httptools)"
    assert protocol in started, started[-2000:]
    assert "event loop uvloop.Loop" in started, started[-2000:]


@pytest.mark.parametrize("size", [40 * 1024, 4 * 1024 * 1024])
def test_a_head_over_the_bound_in_one_send_gets_431_and_is_closed(server: Address, size: int) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size
    for whole in (head + b"\r\n\r\n", head):  # complete, and never finished
        answer = send_request_head(server, whole)
        if size > 1024 * 1024 and answer in (b"", b"<reset>"):  # closed with unread data: RST may beat the answer
            continue
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert error_code(answer) == "headers_too_large"
        assert b"<still open>" not in answer
    still_serves(server)


def test_a_head_trickled_byte_by_byte_over_the_bound_gets_431(server: Address) -> None:
    answer = trickle(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 * 1024))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert error_code(answer) == "headers_too_large"
    assert b"<still open>" not in answer
    still_serves(server)


@pytest.mark.parametrize("chunk", [None, 97], ids=["one-send", "trickled"])
def test_the_header_size_limit_is_exact(server: Address, chunk: int | None) -> None:
    # ingest_api/limits.py counts "name: value\r\n" per header; host (9) + connection (19) + x-pad (9 + value)
    def head(pad: int) -> bytes:
        return (b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: " + b"a" * pad + b"\r\n\r\n")

    at_limit = MAX_HEADER_BYTES - 9 - 19 - 9
    for pad, status in ((at_limit, b"200"), (at_limit + 1, b"431")):
        answer = send_request_head(server, head(pad)) if chunk is None else trickle(server, head(pad), chunk)
        assert answer.startswith(b"HTTP/1.1 " + status), (pad, answer[:200])


def test_too_many_headers_get_431(server: Address) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + b"".join(
        b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n"
    answer = send_request_head(server, head)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert error_code(answer) == "too_many_headers"
    fine = send_request_head(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Ok: " + b"a" * 8000
                             + b"\r\nConnection: close\r\n\r\n")
    assert fine.startswith(b"HTTP/1.1 200"), fine[:200]
    assert b"\r\nserver:" not in fine.lower()  # the server software is not advertised


def test_keep_alive_and_pipelining_still_work(server: Address) -> None:
    with socket.create_connection(server) as sock:
        sock.settimeout(30)
        for i in range(3):  # one after another on one connection
            sock.sendall(produce_request(f"keep-{i}"))
            answer = read_response(sock)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        # three at once, in one send: answered in order, then closed as the last one asks
        sock.sendall(produce_request("p-0") + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                     + produce_request("p-2", close=True))
        answers = recv_all(sock)
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 3, answers
    assert answers.index(b'"offset"') < answers.index(b'"status"') < answers.rindex(b'"offset"')
    assert not answers.endswith(b"<still open>")


def test_a_large_body_in_many_reads_reaches_the_app_whole_and_a_chunked_one_streams(server: Address) -> None:
    """A body of a declared length is gathered below the app (no flow-control pause per 64 KiB);
    it must still arrive complete and in order, with a request pipelined behind it, and a chunked
    body (no declared length) still streams through uvicorn's own path."""
    messages = [{"value": f"{i:07d}" + "x" * 200} for i in range(6000)]
    body = orjson.dumps({"messages": messages})
    assert len(body) > 1024 * 1024
    head = (b"POST /v1/topics/t/batch?ack=wal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    with socket.create_connection(server) as sock:
        sock.settimeout(30)
        sock.sendall(head)
        for at in range(0, len(body), 40_000):
            sock.sendall(body[at : at + 40_000])
            time.sleep(0.002)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer, pipelined = read_responses(sock, 2)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        results = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["results"]
        assert len(results) == 6000 and [r["offset"] for r in results] == list(range(results[0]["offset"],
                                                                                     results[0]["offset"] + 6000))
        assert pipelined.startswith(b"HTTP/1.1 200") and pipelined.endswith(b'{"status":"ok"}'), pipelined
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[at : at + 50_000]), body[at : at + 50_000])
                           for at in range(0, len(body), 50_000)) + b"0\r\n\r\n"
        sock.sendall(b"POST /v1/topics/t/batch?ack=table HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + chunked)  # ack=table: both batches are in Delta
        answer = read_response(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        again = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["results"]
        assert [r["offset"] for r in again] == [results[0]["offset"] + 6000 + i for i in range(6000)]
    rows = httpx.get(f"http://{server[0]}:{server[1]}/v1/topics/t/partitions/0/messages",
                     params={"offset": results[0]["offset"], "limit": 6000}).json()
    assert [m["value"] for m in rows["messages"]] == [m["value"] for m in messages]


# -- the head deadline (a 1 s setting on the `quick` server) -----------------------------------------
def test_a_connection_that_sends_nothing_is_closed_after_the_deadline(quick: Address) -> None:
    with socket.create_connection(quick) as idle:
        assert recv_all(idle) == b""  # closed, with nothing to answer
    still_serves(quick)


def test_a_head_never_completed_gets_408_and_is_closed(quick: Address) -> None:
    with socket.create_connection(quick) as partial:
        partial.sendall(b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\n")
        answer = recv_all(partial)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert error_code(answer) == "request_timeout"
    with socket.create_connection(quick) as slowloris:  # a byte now and then does not extend the deadline
        slowloris.sendall(b"GET /healthz HTTP/1.1\r\n")
        for byte in b"X-A: " + b"a" * 600:  # 2 minutes at most
            if select.select([slowloris], [], [], 0.2)[0]:
                break
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                slowloris.send(bytes([byte]))
        answer = recv_all(slowloris)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    still_serves(quick)


def test_the_deadline_spares_slow_bodies_and_idle_keep_alive(quick: Address) -> None:
    request = produce_request("slow body")
    head, body = request.split(b"\r\n\r\n", 1)
    with socket.create_connection(quick) as sock:
        sock.settimeout(30)
        sock.sendall(head + b"\r\n\r\n" + body[:5])
        time.sleep(1.5)  # past the head deadline, but the head was complete: the body has its own
        sock.sendall(body[5:])
        answer = read_response(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        time.sleep(1.5)  # idle between requests: uvicorn's keep-alive timeout (5 s) applies, not the deadline
        sock.sendall(produce_request("after idle"))
        answer = read_response(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # part of the next head after a response: the deadline again
        answer = recv_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]


def test_a_pipelined_head_left_unfinished_gets_408_after_the_answers(quick: Address) -> None:
    with socket.create_connection(quick) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 2 + b"GET /healthz HTTP/1.1\r\n")
        answers = recv_all(sock)
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 2, answers
    assert answers[answers.rindex(b"HTTP/1.1 "):].startswith(b"HTTP/1.1 408 "), answers


def test_serve_passes_the_limits_to_uvicorn() -> None:
    import inspect

    from lakebroker import server

    assert "**UVICORN_LIMITS" in inspect.getsource(server.run_server)


# -- an answer sent before the body was read: the connection stays under a deadline ----------------
# Fast path: 404 for an unknown topic, 413 for a declared length over max_request_bytes, both from the
# head alone. ASGI path: the batch route's BodyLimit answers 413 from the declared length too.
EARLY = {
    "fast 404": (b"POST /v1/topics/nope/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n", 20, b" 404 "),
    "fast 413": (b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n", 40,
                 b" 413 "),
    "asgi 413": (b"POST /v1/topics/t/batch HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n", 40,
                 b" 413 "),
}


@pytest.mark.parametrize("case", sorted(EARLY))
def test_an_early_answer_then_the_whole_body_then_silence_is_closed(quick: Address, case: str) -> None:
    """The body's last byte after the answer used to clear the idle mark with nothing to set it again:
    the connection stayed open for good, and 4,096 of them filled limit_concurrency (503 for all)."""
    head, _, status = EARLY[case]
    body = b"x" * 20 if case == "fast 404" else None
    with socket.create_connection(quick) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head)
        answer = read_response(sock)
        assert status in answer.split(b"\r\n", 1)[0], answer[:200]
        if body is None:  # the 413s: a body of the declared length would be 1 GB; the connection is done
            sock.sendall(b"x" * 40)
        else:
            sock.sendall(body)
        started = time.monotonic()
        rest = recv_all(sock, timeout=20)
    assert rest == b"", f"{case}: still open 20 s after the body, or answered again: {rest[:200]!r}"
    assert time.monotonic() - started < 15, "closed by the keep-alive timeout (5 s) or the body deadline (3 s)"
    still_serves(quick)


@pytest.mark.parametrize("case", sorted(EARLY))
def test_an_early_answer_then_part_of_the_body_then_silence_is_closed(quick: Address, case: str) -> None:
    head, part, status = EARLY[case]
    with socket.create_connection(quick) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head)
        answer = read_response(sock)
        assert status in answer.split(b"\r\n", 1)[0], answer[:200]
        sock.sendall(b"x" * (part // 2))  # then nothing: the body's deadline (3 s) closes it
        rest = recv_all(sock, timeout=20)
    assert rest == b"", f"{case}: an unfinished body after an early answer held the connection: {rest[:200]!r}"
    still_serves(quick)


def test_an_early_answer_whose_body_completes_keeps_the_connection_for_the_next_request(quick: Address) -> None:
    head, _, _ = EARLY["fast 404"]
    with socket.create_connection(quick) as sock:
        sock.sendall(head)
        assert b" 404 " in read_response(sock).split(b"\r\n", 1)[0]
        sock.sendall(b"y" * 20 + produce_request("after an early answer"))
        answer = read_response(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_with_fast_produce_off_every_request_takes_the_asgi_path(tmp_path: Path) -> None:
    """The setting that keeps `serve` working if an upgraded uvicorn breaks the fast path's pins:
    the protocol is the plain bounded one, and a single produce is answered as before."""
    proc, _ = start_server(tmp_path / "data", LAKEBROKER_FAST_PRODUCE="false")
    try:
        started = proc.log.read_text()
        assert "HTTP protocol lakebroker.ingest_api.http_limits.BoundedHttpToolsProtocol (httptools)" in started, \
            started[-2000:]
        r = httpx.post(proc.url + "/v1/topics/t/messages", json={"value": 1})
        assert r.status_code == 200 and r.json() == {"partition": 0, "offset": 0, "duplicate": False}
    finally:
        proc.stop()
