"""An ASGI guard that refuses request bodies over the configured size with a 413."""

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


async def _too_large(send: Send, declared: int, limit: int) -> None:
    import orjson

    body = orjson.dumps(
        {"error": {"code": "too_large", "message": f"request body of {declared} bytes is over the server limit "
                   f"of {limit} bytes (setting max_request_bytes)"}}
    )
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
