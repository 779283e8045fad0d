"""Maps every error to its HTTP answer, in one place: `{"error": {"code", "message"}}`, or under
/topics and /v3 (Confluent's REST Proxy v2 and v3) those APIs' `{"error_code", "message"}`."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lakebroker.ingest_api.responses import JSONBytes
from lakebroker.tables.errors import Backpressure, Forbidden, LakebrokerError, RequestTimeout, Unauthenticated


def _error(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> JSONBytes:
    return JSONBytes({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def error_response(exc: LakebrokerError) -> JSONBytes:
    headers = None
    if isinstance(exc, Backpressure):
        headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    elif isinstance(exc, Unauthenticated):  # RFC 6750
        invalid = ', error="invalid_token"' if exc.invalid_token else ""
        headers = {"WWW-Authenticate": f'Bearer realm="lakebroker"{invalid}'}
    elif isinstance(exc, Forbidden) and exc.scope is not None:
        headers = {"WWW-Authenticate": f'Bearer realm="lakebroker", error="insufficient_scope", scope="{exc.scope}"'}
    elif isinstance(exc, RequestTimeout):  # RFC 9110: the rest of the body is never read
        headers = {"Connection": "close"}
    return _error(exc.status, exc.code, exc.message, headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LakebrokerError)
    async def lakebroker_error(_: Request, exc: LakebrokerError) -> JSONBytes:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONBytes:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
        return _error(422, "invalid_request", "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONBytes:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # RFC 9110: every method of the resource, not just the first route's
            headers["Allow"] = ", ".join(sorted(_allowed_methods(request)))
        return _error(exc.status_code, code, str(exc.detail), headers)


def _allowed_methods(request: Request) -> set[str]:
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route.methods
    return methods


# -- Kafka REST Proxy v2 and v3 -----------------------------------------------------------------
# Routes under /topics speak Confluent's REST Proxy v2, and under /v3 its v3: every error there,
# whoever raised it (the auth gate, the body limit, a route, FastAPI), answers `{"error_code",
# "message"}`. v2's codes are Confluent's (kafka-rest Errors, rest-utils KafkaExceptionMapper)
# where one exists, otherwise the HTTP status * 100 + 1, with v2's media type; v3's code is the
# HTTP status, in plain JSON.
V2_MEDIA = "application/vnd.kafka.v2+json"
V2_CODES = {"unauthenticated": 40101, "forbidden": 40301, "not_found": 40401, "backpressure": 42901}
V2_PARTITION_NOT_FOUND = 40402


def is_v2_path(path: str) -> bool:
    return path == "/topics" or path.startswith("/topics/")


def is_v3_path(path: str) -> bool:
    return path == "/v3" or path.startswith("/v3/")


def v2_error(status: int, message: str, error_code: int | None = None) -> JSONBytes:
    return JSONBytes({"error_code": error_code or status * 100 + 1, "message": message}, status_code=status,
                     media_type=V2_MEDIA)


class ProxyErrorShape:
    """ASGI middleware: rewrites `{"error": {"code", "message"}}` answers on v2 and v3 paths into
    their shape.

    It sits outermost, so it sees the auth gate's 401s and the limits' 413/431 as well as the
    routes' errors. Only an error answer in our shape is buffered and rewritten; the rest streams."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        v2 = scope["type"] == "http" and is_v2_path(scope["path"])
        if not (v2 or (scope["type"] == "http" and is_v3_path(scope["path"]))):
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        chunks: list[bytes] = []

        async def reshape(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                ours = message["status"] >= 400 and dict(message.get("headers", ())).get(
                    b"content-type", b"").startswith(b"application/json")
                if ours:
                    held = message
                    return
            elif held is not None and message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                await _send_reshaped(send, held, b"".join(chunks), v2)
                return
            await send(message)

        await self.app(scope, receive, reshape)


async def _send_reshaped(send: Send, start: Message, body: bytes, v2: bool) -> None:
    try:
        error = orjson.loads(body)["error"]
        status = int(start["status"])
        code = V2_CODES.get(error["code"], status * 100 + 1) if v2 else status
        body = orjson.dumps({"error_code": code, "message": error["message"]})
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass  # not one of ours: pass it on as it is
    else:
        headers = [(k, v) for k, v in start.get("headers", ()) if k not in (b"content-type", b"content-length")]
        start = {**start, "headers": [*headers, (b"content-type", (V2_MEDIA if v2 else "application/json").encode()),
                                      (b"content-length", str(len(body)).encode())]}
    await send(start)
    await send({"type": "http.response.body", "body": body})
