"""The ingest tier: HTTP → WAL → Delta. `create_app` builds the FastAPI app for a data dir."""

from ingest_api.app import create_app

__all__ = ["create_app"]
