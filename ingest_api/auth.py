"""Who may call which route: bearer tokens (tables/tokens.py), declared where routers are included.

    app.include_router(produce.router, dependencies=[require(Scope.PRODUCE)], responses=AUTH_ERRORS)
    app.include_router(ops.router, dependencies=[public()])

`check_every_route_decided` refuses to build an app holding a route without such a decision,
so a new router cannot be added unprotected by accident.

Two steps, both driven by those declarations:
- `AuthGate` (ASGI middleware) authenticates every request to a non-public route before
  anything reads its body: a missing, unknown, revoked or expired token gets 401 with
  `WWW-Authenticate: Bearer`, and an unknown path answers 401 rather than 404.
- `require` (the route dependency) authorizes: 403 for a token without the scope, or whose
  topic allow-list does not hold the route's `{topic}`. A token limited to some topics may
  only call routes whose topic can be checked: those with a `{topic}` path parameter, and
  those included with `topic_checked_by_route=True`, which apply `check_topic` themselves.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from lakebroker.ingest_api.errors import error_response
from lakebroker.ingest_api.schemas import ErrorPublic, inline_schema
from lakebroker.tables.errors import Forbidden, LakebrokerError, StorageUnavailable, Unauthenticated
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import ApiToken, TokenSet, TokenStore
from lakebroker.tables.tokens import Scope as TokenScope

log = logging.getLogger(__name__)

AUTHENTICATED: Final = "authenticated"  # any valid token, whatever its scopes
Need = TokenScope | Literal["authenticated"]

# Always JSON in our format, whatever the route's own media type (the Kafka REST proxy's too).
_ERROR_JSON = {"application/json": {"schema": inline_schema(ErrorPublic)}}
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "No token, or an unknown, revoked or expired one.", "content": _ERROR_JSON},
    403: {"description": "The token lacks the scope or the topic.", "content": _ERROR_JSON},
}
_READS = frozenset({"GET", "HEAD"})
_MARK = "_lakebroker_access"
_ACCESS = "_lakebroker_access_rule"
_STATE_KEY = "principal"

# When auth is off, every request acts with every scope on every topic.
OPEN_ACCESS = ApiToken(token_id="-", scopes=frozenset(TokenScope), name="auth off")

_bearer = HTTPBearer(auto_error=False, scheme_name="token",
                     description="An API token from `lakebroker tokens create`: `Authorization: Bearer lbk_...`.")


def auth_enforced(settings: Settings) -> bool:
    """`auto`: required unless the server binds only a loopback address."""
    if settings.auth != "auto":
        return settings.auth == "required"
    return not is_loopback(settings.host)


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another host name: it may resolve to anything


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Authenticator:
    """Checks bearer tokens against a cached read of the token table, refreshed every `max_age_s`.
    `clock` times the cache and `now` judges expiry: the system's unless a test gives its own."""

    def __init__(self, store: TokenStore, enforced: bool, max_age_s: float, *,
                 clock: Callable[[], float] = time.monotonic, now: Callable[[], datetime] = _utc_now) -> None:
        self.store = store
        self.enforced = enforced
        self.max_age_s = max_age_s
        self.clock = clock
        self.now = now
        self._tokens = TokenSet({})
        self._loaded_at = -float("inf")
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        if not self.enforced:
            log.warning("auth is off: every route answers without a token (setting auth)")
            return
        await self._refresh()
        now = self.now()
        active = sum(1 for t, _ in self._tokens.tokens.values() if t.status(now) == "active")
        if active == 0:
            log.warning("auth is required and no active token exists: every route but /healthz and /readyz "
                        "answers 401; create one with `lakebroker tokens create --scope admin`")
        else:
            log.info("auth is required: %d active API tokens", active)

    async def authenticate(self, token: str | None) -> ApiToken:
        principal = self.authenticate_now(token)
        if principal is None:
            await self._refresh()
            principal = self._tokens.authenticate(token or "", self.now())
        return principal

    def authenticate_now(self, token: str | None) -> ApiToken | None:
        """`authenticate` without waiting: None when the answer needs a fresh read of the token table."""
        if not self.enforced:
            return OPEN_ACCESS
        if not token:
            raise Unauthenticated("this route needs an API token: send `Authorization: Bearer lbk_...`")
        if self.clock() - self._loaded_at > self.max_age_s:
            return None
        return self._tokens.authenticate(token, self.now())

    async def _refresh(self) -> None:
        async with self._lock:
            if self.clock() - self._loaded_at <= self.max_age_s:
                return  # another request refreshed while this one waited
            started = self.clock()
            try:
                version = await asyncio.to_thread(self.store.version)
                if version is None or version != self._tokens.version:
                    self._tokens = await asyncio.to_thread(self.store.load)
            except Exception as exc:  # fail closed, with an answer that says why
                log.exception("cannot read the token table %s", self.store.layout.tokens_table)
                raise StorageUnavailable("cannot read the token table; see the server log") from exc
            self._loaded_at = started


class AuthGate:
    """Authenticates each request to a non-public route before the route (or FastAPI) reads its body."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator, public_routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.authenticator = authenticator
        self.public_routes = public_routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.authenticator.enforced and not self._public(scope):
            try:
                principal = await self.authenticator.authenticate(bearer_token(scope))
            except LakebrokerError as exc:  # 401, or 507 when the token table cannot be read
                await error_response(exc)(scope, receive, send)
                return
            admit(scope, principal)
        await self.app(scope, receive, send)

    def _public(self, scope: Scope) -> bool:
        return any(route.matches(scope)[0] is not Match.NONE for route in self.public_routes)


def bearer_token(scope: Scope) -> str | None:
    return bearer_of(scope["headers"])


def bearer_of(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of the first Authorization header, if it is a bearer one."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


@dataclass(frozen=True)
class Access:
    """Who may call a router's routes, as `require` declares it."""

    need: Need
    read: Need | None = None
    paths: Mapping[str, Need] | None = None  # route-path prefix -> need, for any method
    topic_checked_by_route: bool = False

    def need_of(self, method: str, route_path: str) -> Need:
        if self.paths:
            for prefix, path_need in self.paths.items():
                if route_path.startswith(prefix):
                    return path_need
        if self.read is not None and method in _READS:
            return self.read
        return self.need

    def authorize(self, principal: ApiToken, method: str, route_path: str, topic: str | None) -> None:
        """Raises Forbidden unless `principal` may call this route (on `topic`, its `{topic}` parameter)."""
        wanted = self.need_of(method, route_path)
        if wanted != AUTHENTICATED:
            check_scope(principal, TokenScope(wanted))
        if topic is not None:
            check_topic(principal, topic)
        elif principal.topics is not None and not self.topic_checked_by_route:
            raise Forbidden(f"{principal.label()} is limited to topics {', '.join(principal.topics)}, "
                            "and this route is not about one topic")


async def principal_of(scope: Scope, authenticator: Authenticator, token: str | None) -> ApiToken:
    """The caller AuthGate admitted, or (with no AuthGate in front) the one `token` names."""
    principal: ApiToken | None = scope.get("state", {}).get(_STATE_KEY)
    if principal is None:
        principal = await authenticator.authenticate(token)
    return principal


def admitted(scope: Scope) -> ApiToken:
    """The caller a plain ASGI route admitted (asgi_route.py stores it where AuthGate does)."""
    principal: ApiToken | None = scope.get("state", {}).get(_STATE_KEY)
    if principal is None:
        raise Unauthenticated("this route needs an API token")
    return principal


def admit(scope: Scope, principal: ApiToken) -> None:
    scope.setdefault("state", {})[_STATE_KEY] = principal


def require(
    need: Need,
    *,
    read: Need | None = None,
    paths: Mapping[str, Need] | None = None,
    topic_checked_by_route: bool = False,
) -> Any:
    """A dependency that admits a token with `need`.

    `read` is the need of GET and HEAD instead; `paths` maps a route-path prefix (as written
    in the route, e.g. "/v1/subscriptions/{name}/dead-letters") to its need, for any method.
    Routes served by a plain ASGI handler (ingest_api/asgi_route.py) apply the same `Access`.
    """
    access = Access(need, read, paths, topic_checked_by_route)

    async def check_access(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> ApiToken:
        principal = await principal_of(request.scope, request.app.state.auth,
                                       credentials.credentials if credentials else None)
        template = getattr(request.scope.get("route"), "path", "")
        access.authorize(principal, request.method, template, request.path_params.get("topic"))
        request.state.principal = principal
        return principal

    setattr(check_access, _MARK, str(need))
    setattr(check_access, _ACCESS, access)
    return Depends(check_access)


def access_rule(route: BaseRoute) -> Access | None:
    """The `Access` a router included this route with, or None for a public route."""
    for dep in getattr(route, "dependencies", ()):
        access = getattr(dep.dependency, _ACCESS, None)
        if access is not None:
            return access  # type: ignore[no-any-return]
    return None


def public() -> Any:
    """The explicit decision that a router's routes answer without a token."""

    async def no_token_needed() -> None:
        return None

    setattr(no_token_needed, _MARK, "public")
    return Depends(no_token_needed)


def check_scope(principal: ApiToken, scope: TokenScope) -> None:
    if not principal.has(scope):
        raise Forbidden(f"{principal.label()} lacks the {scope!s} scope this call needs", scope=str(scope))


def check_topic(principal: ApiToken, topic: str) -> None:
    if not principal.allows_topic(topic):
        raise Forbidden(f"{principal.label()} may not use topic {topic!r}")


def current_principal(request: Request) -> ApiToken:
    """The caller, as admitted by the router's `require`."""
    principal: ApiToken | None = getattr(request.state, _STATE_KEY, None)
    if principal is None:
        raise Unauthenticated("this route needs an API token")
    return principal


PrincipalDep = Annotated[ApiToken, Depends(current_principal)]


def access_of(route: BaseRoute) -> str | None:
    """The access declared for a route: "public", the scope it needs, or None when nobody decided."""
    for dep in getattr(route, "dependencies", ()):
        mark = getattr(dep.dependency, _MARK, None)
        if mark is not None:
            return str(mark)
    return None


def docs_paths(app: FastAPI) -> set[str]:
    """The routes FastAPI adds for the docs: no data, public while setting docs_public is true."""
    paths = {app.openapi_url, app.docs_url, app.redoc_url}
    if app.docs_url and app.swagger_ui_oauth2_redirect_url:
        paths.add(app.swagger_ui_oauth2_redirect_url)
    return {p for p in paths if p}


def public_routes(app: FastAPI) -> list[BaseRoute]:
    docs = docs_paths(app)
    return [r for r in app.routes if access_of(r) == "public" or getattr(r, "path", None) in docs]


def check_every_route_decided(app: FastAPI) -> None:
    docs = docs_paths(app)
    undecided = [f"{sorted(getattr(r, 'methods', None) or [])} {getattr(r, 'path', r)}" for r in app.routes
                 if access_of(r) is None and not (not isinstance(r, APIRoute) and getattr(r, "path", None) in docs)]
    if undecided:
        raise RuntimeError(
            f"routes without an access decision: {', '.join(undecided)}. Include their router with "
            "dependencies=[require(Scope...)] or dependencies=[public()] (ingest_api/auth.py)"
        )
