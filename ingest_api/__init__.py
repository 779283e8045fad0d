"""The ingest tier: HTTP → WAL → Delta. `create_app` builds the FastAPI app for a data dir.

Imported lazily: the CLI needs `lakebroker.ingest_api.broker`'s types, not FastAPI (a second off each command)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakebroker.ingest_api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from lakebroker.ingest_api.app import create_app

        return create_app
    raise AttributeError(f"module 'ingest_api' has no attribute {name!r}")
