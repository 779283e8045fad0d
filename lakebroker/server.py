"""`lakebroker serve`: the ingest API on uvicorn, plus the background workers."""

from __future__ import annotations

import logging
import os
import socket

import orjson
import uvicorn

from ingest_api import create_app
from tables.layout import Layout
from tables.settings import Settings


def run_server(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings.ensure_dirs()
    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    port = sock.getsockname()[1]
    settings = settings.model_copy(update={"port": port})
    layout = Layout(settings.data_dir)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host

    def announce() -> None:  # only once this process holds the data-dir lock
        layout.server_file.write_bytes(orjson.dumps({"url": f"http://{host}:{port}", "pid": os.getpid()}))

    app = create_app(settings, on_started=announce)

    config = uvicorn.Config(app, log_level=settings.log_level, access_log=False, timeout_graceful_shutdown=10,
                            limit_concurrency=4096, h11_max_incomplete_event_size=64 * 1024)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        layout.server_file.unlink(missing_ok=True)
