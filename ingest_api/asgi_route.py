"""Routes documented by FastAPI but served by a plain ASGI handler: the produce hot path.

FastAPI builds a route's OpenAPI entry from its endpoint's signature, and serves it by solving
dependencies, building a Request and validating parameters: about half the CPU of a
single-message produce. An `AsgiRoute` keeps the first and replaces the second. Its endpoint
is a documentation stub marked with `@served_by(handler)`; requests go straight to the handler,
after the same authorization check (`lakebroker.ingest_api.auth.Access`) the router declares for every
other route. The middleware (header and body limits, authentication) is unchanged.

    router = APIRouter(prefix="/v1/topics", route_class=AsgiRoute)

    @router.post("/{topic}/messages", responses=...)
    @served_by(produce_one)
    async def produce_one_doc(topic: TopicPath, ack: AckMode = ACK) -> ProduceResultPublic:
        \"\"\"Produce one message.\"\"\"
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from lakebroker.ingest_api.auth import access_rule, admit, bearer_token, principal_of
from lakebroker.ingest_api.errors import error_response
from lakebroker.tables.errors import LakebrokerError

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
F = TypeVar("F", bound=Callable[..., Any])
_HANDLER = "_lakebroker_asgi_handler"


def served_by(handler: Handler) -> Callable[[F], F]:
    """Marks a documentation stub: `handler` answers its route's requests."""

    def mark(stub: F) -> F:
        setattr(stub, _HANDLER, handler)
        return stub

    return mark


class AsgiRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        handler: Handler | None = getattr(endpoint, _HANDLER, None)
        if handler is not None:
            self.app = self._authorized(handler)

    def _authorized(self, handler: Handler) -> Handler:
        access = access_rule(self)  # None: a public route
        route_path = self.path

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if access is not None:
                try:
                    principal = await principal_of(scope, scope["app"].state.auth, bearer_token(scope))
                    access.authorize(principal, scope["method"], route_path, scope["path_params"].get("topic"))
                    admit(scope, principal)
                except LakebrokerError as exc:
                    await error_response(exc)(scope, receive, send)
                    return
            await handler(scope, receive, send)

        return app


# -- what a handler needs of the raw request -------------------------------------------------
def header(scope: Scope, name: bytes) -> str:
    return header_in(scope["headers"], name)


def header_in(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    """The first `name` header's value ("" without one)."""
    for key, value in headers:
        if key == name:
            return str(value.decode("latin-1"))
    return ""


def query_of(scope: Scope) -> dict[str, str]:
    return parse_query(scope["query_string"])


def parse_query(raw: bytes) -> dict[str, str]:
    if not raw:
        return {}
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))  # the last of a repeated name wins


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class FrontDoor:
    """The outermost app middleware: a produce request (POST /v1/topics/{topic}/<name>) goes down a
    short chain, the request guards then its `AsgiRoute` handler, skipping FastAPI's exception
    layers and the router's walk over every route; any other request goes to the full app.

    `guards` are the same middleware classes and arguments the full app runs, innermost first."""

    def __init__(self, app: ASGIApp, api: FastAPI, guards: Sequence[tuple[Any, dict[str, Any]]]) -> None:
        self.app = app
        self.api = api
        self.handlers: dict[str, ASGIApp] = {}
        for route in api.routes:
            parts = getattr(route, "path", "").split("/")
            if isinstance(route, AsgiRoute) and route.methods == {"POST"} and parts[:3] == ["", "v1", "topics"] \
                    and len(parts) == 5 and parts[3] == "{topic}":
                chain: ASGIApp = route.app
                for guard, kwargs in guards:
                    chain = guard(chain, **kwargs)
                self.handlers[parts[4]] = chain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            parts = scope["path"].split("/")
            if len(parts) == 5 and parts[1] == "v1" and parts[2] == "topics" and parts[3]:
                handler = self.handlers.get(parts[4])
                if handler is not None:
                    scope["app"] = self.api  # what Starlette sets for every request: handlers read its state
                    scope["path_params"] = {"topic": parts[3]}
                    await handler(scope, receive, send)
                    return
        await self.app(scope, receive, send)
