"""Maps every error to its HTTP answer, in one place: `{"error": {"code", "message"}}`."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ingest_api.responses import JSONBytes
from tables.errors import Backpressure, LakebrokerError


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONBytes:
    return JSONBytes({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LakebrokerError)
    async def lakebroker_error(_: Request, exc: LakebrokerError) -> JSONBytes:
        headers = None
        if isinstance(exc, Backpressure):
            headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
        return _error(exc.status, exc.code, exc.message, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONBytes:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
        return _error(422, "invalid_request", "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONBytes:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))
