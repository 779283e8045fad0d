"""The live dashboard: the page at `/` (static files, no data) and its JSON at `/v1/dashboard`.

The page is a static shell, so it is served without a token; everything it shows comes from
`GET /v1/dashboard`, which needs the admin scope when auth is on (it lists every topic,
subscription and dead letter, and its replay button calls an admin route). The page sends the
token as `Authorization: Bearer`: it takes one from `/?token=lbk_...` once, keeps it in
sessionStorage (this tab only) and removes it from the address bar, or asks for one on a 401.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse

from lakebroker.ingest_api.auth import PrincipalDep
from lakebroker.ingest_api.dashboard import Dashboard, for_principal
from lakebroker.ingest_api.responses import JSONBytes
from lakebroker.tables.errors import NotFound

STATIC = Path(__file__).resolve().parent.parent / "static"
_ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # a ?token= must not leak to another site
}
_PAGE_HEADERS = {
    **_HEADERS,
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
}

page_router = APIRouter(tags=["dashboard"])
router = APIRouter(prefix="/v1/dashboard", tags=["dashboard"])


def get_dashboard(request: Request) -> Dashboard:
    dashboard: Dashboard = request.app.state.dashboard
    return dashboard


DashboardDep = Annotated[Dashboard, Depends(get_dashboard)]


@page_router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC / "dashboard.html", media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)


@page_router.get("/dashboard/{asset}", include_in_schema=False)
async def asset(asset: str) -> FileResponse:
    media_type = _ASSETS.get(asset)
    if media_type is None:
        raise NotFound(f"no dashboard asset {asset!r}")
    return FileResponse(STATIC / asset, media_type=f"{media_type}; charset=utf-8", headers=_HEADERS)


@router.get("", response_class=JSONBytes, responses={200: {"description": "The dashboard snapshot."}})
async def dashboard_snapshot(dashboard: DashboardDep, principal: PrincipalDep) -> Any:
    """Topics (per-partition offsets, size, produce rate), subscriptions (lag, delivered, pending,
    dead-lettered, endpoint state), the last maintenance-job runs and the dead letters, as the
    dashboard at `/` shows them. Recomputed at most twice a second."""
    return JSONBytes(for_principal(await dashboard.snapshot(), principal))
