"""`lakebroker serve`: the composition root. It builds the ingest node's parts (ingest_api/node.py)
and hands them to its doors (the app, the fast single-message path), the delivery that runs beside
it (setting `delivery_mode`) and the Spark job scheduler, and serves the app on uvicorn.
The service packages never import each other; only this module and the CLI see them all."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import orjson
import uvicorn
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lakebroker.delivery_worker.embedded import embedded_delivery
from lakebroker.ingest_api import create_app
from lakebroker.ingest_api.auth import is_loopback
from lakebroker.ingest_api.fast_produce import FastProduce
from lakebroker.ingest_api.http_fast_produce import fast_protocol
from lakebroker.ingest_api.http_limits import BoundedHttpToolsProtocol, bounded_protocol
from lakebroker.ingest_api.kafka.listener import KafkaListener
from lakebroker.ingest_api.live_status import Service
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.node import IngestNode
from lakebroker.ingest_api.node_identity import advertised_url, refuse_twin
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.layout import Layout
from lakebroker.tables.lock import DataDirLock
from lakebroker.tables.logs import configure_logging
from lakebroker.tables.settings import Settings

# Request limits and timeouts of the HTTP server (body size: setting max_request_bytes; header
# count and size: ingest_api/limits.py). httptools on uvloop, the fastest uvicorn offers
# (docs/decisions/0002-single-produce-answered-below-asgi.md).
# BoundedHttpToolsProtocol adds the request-head bound and deadline that httptools lacks.
UVICORN_LIMITS: dict[str, Any] = {
    "http": BoundedHttpToolsProtocol,  # httptools + a bound on a request head (431) and its deadline (408)
    "loop": "uvloop",
    "limit_concurrency": 4096,  # open connections + in-flight requests; beyond it new requests get 503
    "backlog": 2048,  # pending TCP connections the kernel queues
    "timeout_keep_alive": 5,  # close an idle keep-alive connection after 5 s
    "timeout_graceful_shutdown": 10,  # on SIGTERM, requests in flight get 10 s to finish
    "server_header": False,  # do not advertise the server software and version
}


def build_app(settings: Settings, registry: CollectorRegistry | None = None,
              on_started: Callable[[], None] | None = None, *, node: IngestNode | None = None,
              kafka: KafkaListener | None = None) -> FastAPI:
    """The ingest app over `node` (by default one built for `settings`, its metrics in `registry`)
    with the services that run beside it, started once the node holds the data-dir lock: the Kafka
    listener if given, and the delivery, shown through the app's subscription status and dashboard."""
    node = node or IngestNode.build(settings, registry)
    # a supervised child process, or a task on this loop; its metrics beside the node's
    delivery = embedded_delivery(settings, node.metrics.registry)
    services: list[Service] = [s for s in (kafka, delivery) if s is not None]
    return create_app(settings, on_started=on_started, services=services, live_status=delivery, node=node)


def kafka_listener(settings: Settings, node: IngestNode, *, reuse_port: bool = False) -> KafkaListener | None:
    """The Kafka door over `node`'s produce core, unless the setting turns it off. It advertises the
    host of the node's URL."""
    if not settings.kafka_listener:
        return None
    advertised = urlsplit(advertised_url(settings)).hostname or settings.host
    return KafkaListener(node.core, node.auth, settings.host, settings.kafka_port, advertised,
                         AckMode(settings.kafka_acks_all), reuse_port=reuse_port, tls=kafka_tls(settings))


def kafka_tls(settings: Settings) -> ssl.SSLContext | None:
    """The Kafka listener's TLS context from its certificate and key, or None (plaintext)."""
    if settings.kafka_tls_cert is None or settings.kafka_tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(settings.kafka_tls_cert, settings.kafka_tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(f"the Kafka listener's TLS certificate {settings.kafka_tls_cert} or key "
                             f"{settings.kafka_tls_key} cannot be loaded: {exc}") from None
    return context


def _already_shut_down(signum: int, frame: object) -> None:
    """uvicorn has already shut down on this signal: nothing more to do."""


def listen(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound TCP socket (uvicorn listens on it). `reuse_port`: one of several processes on one
    port (SO_REUSEPORT: the kernel spreads connections over them; lakebroker/workers.py)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def worker_url(settings: Settings, port: int) -> str:
    """The URL one of `serve --workers`' processes advertises: a single node's (`advertised_url`:
    the setting, else HOST, with the machine's name for a wildcard HOST) at the worker's own port.
    That port is the worker's alone and speaks plain HTTP, so only the host is kept."""
    host = urlsplit(advertised_url(settings)).hostname or settings.host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_server(settings: Settings, *, reuse_port: bool = False) -> None:
    """Serve until SIGTERM or SIGINT. `reuse_port`: as one of `serve --workers`' processes, which share
    the port; each also listens on a port of its own, which it advertises to the other nodes."""
    configure_logging(settings)
    if settings.auth == "off" and not is_loopback(settings.host):
        logging.getLogger(__name__).warning(
            "auth=off on %s: anyone who can reach this address can produce, read and delete topics", settings.host)
    settings.ensure_dirs()
    DataDirLock(Layout.of(settings).lock_file).refuse_if_held(settings.data_dir)
    sock = listen(settings.host, settings.port, reuse_port=reuse_port)
    sockets = [sock]
    port = sock.getsockname()[1]
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    update: dict[str, Any] = {"port": port}
    if reuse_port:  # forwarded messages must reach this process, not whichever one the kernel picks
        own = listen(settings.host, 0)
        sockets.append(own)
        update["advertised_url"] = worker_url(settings, own.getsockname()[1])
    settings = settings.model_copy(update=update)
    layout = Layout.of(settings)
    refuse_twin(settings)

    # Spark maintenance jobs (spark_pipeline/scheduler.py): child processes on the configured
    # intervals, started once this process holds the data-dir lock; their runs show in /metrics.
    from lakebroker.spark_pipeline.metrics import JobMetricsCollector
    from lakebroker.spark_pipeline.scheduler import shutdown as stop_jobs
    from lakebroker.spark_pipeline.scheduler import start_scheduler

    registry = CollectorRegistry()
    registry.register(JobMetricsCollector(layout))
    jobs: list[Any] = []

    config: uvicorn.Config

    def announce() -> None:  # only once this process holds the data-dir lock
        http, loop = config.http_protocol_class, type(asyncio.get_running_loop())
        parser = "httptools" if issubclass(http, HttpToolsProtocol) else "not httptools"
        logging.getLogger(__name__).info("HTTP protocol %s.%s (%s), event loop %s.%s", http.__module__,
                                         http.__qualname__, parser, loop.__module__, loop.__qualname__)
        layout.server_file.write_bytes(orjson.dumps({"url": f"http://{host}:{port}", "pid": os.getpid(),
                                                     "kafka": f"{host}:{kafka.port}" if kafka else None}))
        jobs.append(start_scheduler(settings))

    # One node's parts, handed to both doors: the app (ASGI) and the fast single-message path
    # answered by the HTTP protocol itself (ingest_api/http_fast_produce.py).
    node = IngestNode.build(settings, registry)
    kafka = kafka_listener(settings, node, reuse_port=reuse_port)
    app = build_app(settings, on_started=announce, node=node, kafka=kafka)
    deadlines = settings.header_read_timeout_s, settings.body_read_timeout_s
    http = (fast_protocol(deadlines[0], FastProduce(node, app), deadlines[1]) if settings.fast_produce
            else bounded_protocol(*deadlines))
    limits = {**UVICORN_LIMITS, "http": http}

    # log_config=None: uvicorn adds no handlers of its own; its records go through configure_logging's.
    config = uvicorn.Config(app, log_level=settings.log_level, log_config=None, access_log=settings.access_log,
                            **limits)
    # uvicorn shuts down gracefully on SIGTERM or SIGINT, then raises that signal again with the
    # handler it found installed. Under the default action the process would die right there,
    # before the cleanup below (and exit -15); this handler lets it finish and exit 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _already_shut_down)
    try:
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        for scheduler in jobs:
            stop_jobs(scheduler)
        layout.server_file.unlink(missing_ok=True)
