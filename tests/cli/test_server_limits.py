"""HTTP request limits of `lakebroker serve`: header size and count, and the header deadline."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from lakebroker.http_protocol import BoundedH11Protocol
from lakebroker.server import UVICORN_LIMITS
from tests.servers import ServerProcess


def recv_all(sock: socket.socket, timeout: float) -> bytes:
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


def send_request_head(address: tuple[str, int], head: bytes) -> bytes:
    with socket.create_connection(address) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed on us mid-send
            sock.sendall(head)
        return recv_all(sock, 10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    proc = ServerProcess(tmp_path_factory.mktemp("limits") / "data", env={"LAKEBROKER_DELIVER_IN_SERVE": "false"})
    url = proc.start()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        yield host, int(port)
    finally:
        proc.stop()


def test_serve_uses_h11_with_the_header_deadline() -> None:
    # httptools (uvicorn's default when installed) ignores h11_max_incomplete_event_size.
    assert UVICORN_LIMITS["http"] is BoundedH11Protocol
    assert UVICORN_LIMITS["h11_max_incomplete_event_size"] == 16 * 1024


def test_oversized_request_head_is_refused(server: tuple[str, int]) -> None:
    # Over h11's buffer bound while incomplete: 400 and closed. Whole in one read: our 431.
    for size in (17 * 1024, 40 * 1024, 4 * 1024 * 1024):
        answer = send_request_head(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
                                   + b"a" * size + b"\r\n\r\n")
        assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431")) or answer in (b"", b"<reset>"), answer[:200]
        assert b"<still open>" not in answer
    fine = send_request_head(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Ok: " + b"a" * 8000
                             + b"\r\nConnection: close\r\n\r\n")
    assert fine.startswith(b"HTTP/1.1 200"), fine[:200]
    assert b"\r\nserver:" not in fine.lower()  # the server software is not advertised


def test_too_many_headers_get_431(server: tuple[str, int]) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + b"".join(
        b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n"
    answer = send_request_head(server, head)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b'"code":"too_many_headers"' in answer


# -- the header deadline, on a bare app so the test need not wait 10 s ------------------------------
class QuickDeadline(BoundedH11Protocol):
    header_timeout_s = 0.5


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def quick_server() -> Iterator[tuple[str, int]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(echo_app, http=QuickDeadline, lifespan="off", log_level="warning",
                            timeout_keep_alive=30)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield sock.getsockname()
    server.should_exit = True
    thread.join(10)


def test_a_connection_that_never_finishes_its_headers_is_closed(quick_server: tuple[str, int]) -> None:
    with socket.create_connection(quick_server) as idle:  # sends nothing at all
        started = time.monotonic()
        assert recv_all(idle, 5) == b""
        assert time.monotonic() - started < 2
    with socket.create_connection(quick_server) as slow:  # a slowloris: a byte now and then
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        slow.sendall(b"X-A: 1\r\n")  # data alone does not extend the deadline
        assert recv_all(slow, 5) == b""


def test_the_deadline_spares_slow_bodies_and_rearms_between_requests(quick_server: tuple[str, int]) -> None:
    with socket.create_connection(quick_server) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
        time.sleep(1.0)  # past the header deadline, but the head was complete
        sock.sendall(b"cde")
        sock.settimeout(5)
        assert sock.recv(1024).endswith(b"abcde")
        time.sleep(0.2)  # a keep-alive connection may send its next request
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert recv_all(sock, 5) == b""  # then idles past the deadline: closed
        assert time.monotonic() - started < 2


def test_serve_passes_the_limits_to_uvicorn() -> None:
    import inspect

    from lakebroker import server

    assert "**UVICORN_LIMITS" in inspect.getsource(server.run_server)
