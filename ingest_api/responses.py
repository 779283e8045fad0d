"""HTTP answers rendered by orjson: hand-built bodies on the hot path skip pydantic.

An `Answer` is a whole answer (status, headers, body) built once and sent either through ASGI
(`send_answer`) or written by the HTTP protocol itself (ingest_api/http_fast_produce.py's fast
produce path), so both paths answer the same bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import JSONResponse, Response
from starlette.types import Send

JSON_TYPE = b"application/json"


class JSONBytes(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs the hot path a µs more per answer
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]  # lower-case names, as Starlette sends them
    body: bytes

    @classmethod
    def of(cls, response: Response) -> Answer:
        """The answer a Starlette response sends: its status, raw headers and body."""
        return cls(response.status_code, response.raw_headers, bytes(response.body))


def answer(status: int, content_type: bytes, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
    return Answer(status, [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *(headers or ())],
                  body)


def json_answer(status: int, body: bytes) -> Answer:
    # `answer` spelled out: every single-message produce's answer is built here
    return Answer(status, [(b"content-type", JSON_TYPE), (b"content-length", b"%d" % len(body))], body)


async def send_answer(send: Send, answer: Answer) -> None:
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.body})


async def send_body(send: Send, status: int, content_type: bytes, body: bytes,
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send_answer(send, answer(status, content_type, body, headers))


async def send_json(send: Send, status: int, body: bytes) -> None:
    """A JSON body straight to an ASGI `send`, for handlers below the framework."""
    await send_answer(send, json_answer(status, body))
