"""Maps every error to its HTTP answer, in one place: `{"error": {"code", "message"}}`."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from ingest_api.responses import JSONBytes
from tables.errors import Backpressure, Forbidden, LakebrokerError, RequestTimeout, Unauthenticated


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
