"""JSON responses rendered by orjson: hand-built bodies on the hot path skip pydantic."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse
from starlette.types import Send


class JSONBytes(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


async def send_json(send: Send, status: int, body: bytes) -> None:
    """A JSON body straight to an ASGI `send`, for handlers below the framework."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
