"""ASGI guards: request bodies over the configured size get a 413, bodies that do not arrive
whole within the configured deadline a 408 (and the connection closed); too many or too large
headers a 431.

The HTTP server bounds what it buffers of a request head before any of this runs
(ingest_api/http_limits.py), but only while the head is incomplete, and with room for a request
line: a head that arrives whole in one read passes. HeaderLimit makes the header bound exact."""

from __future__ import annotations

import asyncio

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lakebroker.ingest_api.errors import error_response
from lakebroker.ingest_api.responses import Answer, json_answer, send_answer
from lakebroker.tables.errors import LakebrokerError, RequestTimeout, TooLarge


class BodyLimit:
    """Bounds how large a request body may be and how long it may take to arrive (from the app's
    first read of it), so a slow or endless upload cannot hold a connection slot.

    The refusal is raised inside the app's read, and it is also what the client gets: a route
    that turns any body-read error into its own answer (FastAPI answers 400 for a body model)
    has that answer replaced by the refusal."""

    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = declared_too_large(scope["headers"], self.max_bytes)
        if refused is not None:
            await send_answer(send, refused)
            return
        seen = 0
        deadline: float | None = None
        body_done = False
        refusal: LakebrokerError | None = None
        answered = False

        late = False  # refused after the app began its answer (one that streams while it reads)

        async def limited() -> Message:
            nonlocal seen, deadline, body_done, refusal, late
            if body_done:  # later reads wait for a disconnect, which may take as long as it likes
                return await receive()
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.read_timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                refusal, late = body_timeout(self.read_timeout_s), answered
                raise refusal from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if seen > self.max_bytes:
                    refusal, late = TooLarge(f"request body is over the server limit of {self.max_bytes} bytes "
                                             "(setting max_request_bytes)"), answered
                    raise refusal
            return message

        async def answer(message: Message) -> None:
            nonlocal answered
            if refusal is None or late:  # a streamed answer ends as the app ends it, with the refusal in it
                answered = answered or message["type"] == "http.response.start"
                await send(message)
            elif not answered:
                answered = True
                await error_response(refusal)(scope, receive, send)
            # else: the rest of the app's own answer to a refused body is dropped

        await self.app(scope, limited, answer)
        if refusal is not None and not answered:
            await error_response(refusal)(scope, receive, send)


def body_timeout(read_timeout_s: float) -> RequestTimeout:
    return RequestTimeout(f"the request body did not arrive within {read_timeout_s:g} s (setting body_read_timeout_s)")


MAX_HEADERS = 100  # Apache's LimitRequestFields; a produce request needs a handful
MAX_HEADER_BYTES = 16 * 1024  # Node's default; a bearer token and the usual headers are well under 1 KiB


class HeaderLimit:
    def __init__(self, app: ASGIApp, max_headers: int = MAX_HEADERS, max_bytes: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.max_headers = max_headers
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = header_refusal(scope["headers"], self.max_headers, self.max_bytes)
            if refused is not None:
                await send_answer(send, refused)
                return
        await self.app(scope, receive, send)


def header_refusal(headers: list[tuple[bytes, bytes]], max_headers: int = MAX_HEADERS,
                   max_bytes: int = MAX_HEADER_BYTES) -> Answer | None:
    """The 431 for too many or too large headers (HeaderLimit's, and the fast produce path's)."""
    if len(headers) > max_headers:
        return _header_error("too_many_headers", f"the request has {len(headers)} headers; "
                             f"the server accepts at most {max_headers}")
    size = 4 * len(headers) + sum([len(name) + len(value) for name, value in headers])  # "name: value\r\n"
    if size > max_bytes:
        return _header_error("headers_too_large", f"the request headers take {size} bytes; "
                             f"the server accepts at most {max_bytes}")
    return None


def _header_error(code: str, message: str) -> Answer:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    return Answer(431, [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                        (b"connection", b"close")], body)


def declared_too_large(headers: list[tuple[bytes, bytes]], limit: int) -> Answer | None:
    """The 413 for a declared content-length over `limit`, answered before any body is read."""
    for name, value in headers:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = 0
            if declared > limit:
                return json_answer(413, orjson.dumps({"error": {
                    "code": "too_large", "message": f"request body of {declared} bytes is over the server limit "
                    f"of {limit} bytes (setting max_request_bytes)"}}))
    return None
