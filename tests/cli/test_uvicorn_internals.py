"""ingest_api/http_fast_produce.py stands in for uvicorn's RequestResponseCycle and
calls uvicorn's own pipeline code, so it depends on uvicorn internals that no API promises. This
test pins them: after a uvicorn upgrade it fails until someone has re-read the code listed here
against the protocol (see its docstring) and updated the digests."""

from __future__ import annotations

import hashlib
import inspect
from importlib.metadata import version

from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import Server

PINNED = "0.54.0"  # requirements.lock
# What the fast path mirrors or relies on: how a cycle is started, queued, fed, answered, closed and
# shut down, and how a response is written (status line, default headers, connection: close).
RELIED_ON = {
    "HttpToolsProtocol.__init__": HttpToolsProtocol.__init__,
    "HttpToolsProtocol.connection_lost": HttpToolsProtocol.connection_lost,
    "HttpToolsProtocol.on_message_begin": HttpToolsProtocol.on_message_begin,
    "HttpToolsProtocol.on_header": HttpToolsProtocol.on_header,
    "HttpToolsProtocol.on_headers_complete": HttpToolsProtocol.on_headers_complete,
    "HttpToolsProtocol.on_body": HttpToolsProtocol.on_body,
    "HttpToolsProtocol.on_message_complete": HttpToolsProtocol.on_message_complete,
    "HttpToolsProtocol.on_response_complete": HttpToolsProtocol.on_response_complete,
    "HttpToolsProtocol.shutdown": HttpToolsProtocol.shutdown,
    "HttpToolsProtocol._start_asgi_task": HttpToolsProtocol._start_asgi_task,
    "RequestResponseCycle.send": RequestResponseCycle.send,
    "RequestResponseCycle.receive": RequestResponseCycle.receive,  # hands the app bytes(body), whole when gathered
    "RequestResponseCycle.run_asgi": RequestResponseCycle.run_asgi,
    "_get_status_line": httptools_impl._get_status_line,
    "Server.shutdown": Server.shutdown,  # calls each connection's shutdown(), then waits for connections and tasks
    "Server.on_tick": Server.on_tick,  # replaces (never mutates) default_headers: the fast path caches them by identity
}
DIGESTS = {
    "HttpToolsProtocol.__init__": "4f08999410347141",
    "HttpToolsProtocol.connection_lost": "c91a4c9bf2e29c55",
    "HttpToolsProtocol.on_message_begin": "96d377fdc7c2baef",
    "HttpToolsProtocol.on_header": "65d62c044f61fdbd",
    "HttpToolsProtocol.on_headers_complete": "1ea8589acfad92d8",
    "HttpToolsProtocol.on_body": "dba9c32aeba35b6a",
    "HttpToolsProtocol.on_message_complete": "1fbad42dc31fc01f",
    "HttpToolsProtocol.on_response_complete": "64e254f28e389e76",
    "HttpToolsProtocol.shutdown": "d7351fa33f00d430",
    "HttpToolsProtocol._start_asgi_task": "9c08c2571ae9b038",
    "RequestResponseCycle.send": "abdd8601b326a8da",
    "RequestResponseCycle.receive": "8124ae006be71184",
    "RequestResponseCycle.run_asgi": "0f33f2449a444bc2",
    "_get_status_line": "d7012e110d2d2574",
    "Server.on_tick": "60ea49b06ccf68c1",
    "Server.shutdown": "9b33c50562992b1e",
}


def digest(code: object) -> str:
    return hashlib.sha256(inspect.getsource(code).encode()).hexdigest()[:16]  # type: ignore[arg-type]


def test_uvicorn_is_the_pinned_version() -> None:
    assert version("uvicorn") == PINNED


def test_the_uvicorn_code_the_fast_path_relies_on_is_unchanged() -> None:
    changed = {name: digest(code) for name, code in RELIED_ON.items() if DIGESTS.get(name) != digest(code)}
    assert not changed, f"uvicorn changed under ingest_api/http_fast_produce.py: re-read {changed}"


def test_a_whole_body_reaches_the_app_without_another_copy() -> None:
    """The protocol joins a whole body's reads into one bytes object and sets it as the cycle's
    `body` (on_message_complete); receive() hands the app `bytes(self.body)`, which is that very
    object, not a copy of it."""
    source = inspect.getsource(RequestResponseCycle.receive)
    assert '"body": bytes(self.body)' in source
    body = b"".join([b"x" * 70_000, b"y" * 70_000])
    assert bytes(body) is body
