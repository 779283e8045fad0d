"""ASGI guards: request bodies over the configured size get a 413; too many or too large
headers a 431.

The HTTP server bounds what it buffers of a request head before any of this runs
(lakebroker/server.py: h11_max_incomplete_event_size), but h11 checks that bound only while
the head is incomplete: a head that arrives whole in one read (up to 64 KiB or more) passes.
HeaderLimit makes the header bound exact."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tables.errors import TooLarge


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await _too_large(send, declared, self.max_bytes)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise TooLarge(f"request body is over the server limit of {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)


MAX_HEADERS = 100  # Apache's LimitRequestFields; a produce request needs a handful
MAX_HEADER_BYTES = 16 * 1024  # Node's default; a bearer token and the usual headers are well under 1 KiB


class HeaderLimit:
    def __init__(self, app: ASGIApp, max_headers: int = MAX_HEADERS, max_bytes: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.max_headers = max_headers
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            if len(headers) > self.max_headers:
                await _header_error(send, "too_many_headers", f"the request has {len(headers)} headers; "
                                    f"the server accepts at most {self.max_headers}")
                return
            size = sum(len(name) + len(value) + 4 for name, value in headers)  # "name: value\r\n"
            if size > self.max_bytes:
                await _header_error(send, "headers_too_large", f"the request headers take {size} bytes; "
                                    f"the server accepts at most {self.max_bytes}")
                return
        await self.app(scope, receive, send)


async def _header_error(send: Send, code: str, message: str) -> None:
    import orjson

    body = orjson.dumps({"error": {"code": code, "message": message}})
    await send({"type": "http.response.start", "status": 431, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


async def _too_large(send: Send, declared: int, limit: int) -> None:
    import orjson

    body = orjson.dumps(
        {"error": {"code": "too_large", "message": f"request body of {declared} bytes is over the server limit "
                   f"of {limit} bytes (setting max_request_bytes)"}}
    )
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
