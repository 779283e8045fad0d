"""The baseline: a bare ASGI app under the same uvicorn settings as `lakebroker serve`.

Every ingest figure is quoted as a ratio to this app's throughput measured in the same run, so a
shared, noisy 2-core machine still gives comparable numbers. The app reads the whole request body
(as the broker must) and answers a fixed small JSON, the size of a produce acknowledgement.

`--app fastapi` serves instead a framework floor: FastAPI routes with produce_one's signature
(path parameter, Request, a dependency, an enum query parameter) that do no broker work, once with
an `async def` dependency and once (under /sync) with a plain `def` one, as ingest_api/deps.py has.
They show how much of the gap to the baseline is the framework and not the broker.
`--http httptools` overrides the HTTP protocol, for a reference row: what the bare app does under
the protocol `lakebroker serve` chose not to use.

`--processes N` serves the bare app from N processes on one port through SO_REUSEPORT, each on a
CPU of its own when there are enough, as `lakebroker serve --workers N` runs its workers: what the
machine gives a server that adds processes and does no work of its own.

Run as a process: `python -m bench.baseline_app --ready-file PATH`; it binds 127.0.0.1 on a free
port and writes {"url": ..., "pid": ...} to PATH once it is listening.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import orjson
import uvicorn
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import Response

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent exits
BODY = b'{"partition":0,"offset":0,"duplicate":false}'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]

# The uvicorn.Config call of lakebroker/server.py before it named its limits UVICORN_LIMITS;
# uvicorn_settings() reads the live ones, and tests/bench pins that both servers agree.
UVICORN_SETTINGS: dict[str, Any] = {
    "log_level": "info",
    "access_log": False,
    "timeout_graceful_shutdown": 10,
    "limit_concurrency": 4096,
    "h11_max_incomplete_event_size": 64 * 1024,
}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:  # drain the body, as a real endpoint must
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": BODY})


class _Ack(StrEnum):
    NONE = "none"
    WAL = "wal"
    TABLE = "table"


_STATE = object()


def _sync_dep(request: Request) -> object:
    return _STATE


async def _async_dep(request: Request) -> object:
    return _STATE


_ACK = Query(_Ack.WAL)


async def _with_async_dep(
    topic: str, request: Request, dep: Annotated[object, Depends(_async_dep)], ack: _Ack = _ACK
) -> Response:
    await request.body()
    return Response(BODY, media_type="application/json")


async def _with_sync_dep(
    topic: str, request: Request, dep: Annotated[object, Depends(_sync_dep)], ack: _Ack = _ACK
) -> Response:
    await request.body()
    return Response(BODY, media_type="application/json")


def fastapi_app() -> FastAPI:
    api = FastAPI()
    api.post("/v1/topics/{topic}/messages")(_with_async_dep)
    api.post("/sync/v1/topics/{topic}/messages")(_with_sync_dep)
    return api


def uvicorn_settings() -> dict[str, Any]:
    """The uvicorn.Config keywords `lakebroker serve` uses (lakebroker/server.py), log level aside."""
    try:
        from lakebroker.server import UVICORN_LIMITS
    except ImportError:  # an older server.py, before the limits had a name
        return dict(UVICORN_SETTINGS)
    return {"log_level": "info", "access_log": False, **UVICORN_LIMITS}


def _bound(host: str, port: int, reuse_port: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _fork_processes(processes: int, host: str, port: int) -> socket.socket | None:
    """Forks processes 1..N-1, each with a socket of its own on `port`, and pins every process to a
    CPU when there are enough. The socket of the process that returns, None in the first."""
    cpus = sorted(os.sched_getaffinity(0))
    pin = processes <= len(cpus)
    for index in range(1, processes):
        if os.fork() == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # ends with the first process
            if pin:
                os.sched_setaffinity(0, {cpus[index]})
            return _bound(host, port, reuse_port=True)
    if pin:
        os.sched_setaffinity(0, {cpus[0]})
    return None


def serve(ready_file: Path, which: str = "bare", host: str = "127.0.0.1", http: str | None = None,
          processes: int = 1) -> None:
    sock = _bound(host, 0, reuse_port=processes > 1)
    port = sock.getsockname()[1]
    if processes > 1:
        own = _fork_processes(processes, host, port)
        if own is not None:  # a forked process: it serves and writes no ready file
            sock.close()
            _serve_on(own, which, http)
            return
    server = _server(which, http)
    original = server.startup

    async def startup(sockets: list[socket.socket] | None = None) -> None:
        await original(sockets=sockets)
        ready_file.write_bytes(orjson.dumps({"url": f"http://{host}:{port}", "pid": os.getpid()}))

    server.startup = startup  # type: ignore[method-assign]
    try:
        server.run(sockets=[sock])
    finally:
        ready_file.unlink(missing_ok=True)


def _server(which: str, http: str | None) -> uvicorn.Server:
    settings = uvicorn_settings() if http is None else {**uvicorn_settings(), "http": http}
    return uvicorn.Server(uvicorn.Config(app if which == "bare" else fastapi_app(), **settings))


def _serve_on(sock: socket.socket, which: str, http: str | None) -> None:
    _server(which, http).run(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--app", choices=["bare", "fastapi"], default="bare")
    parser.add_argument("--http", choices=["h11", "httptools"], help="override the server's HTTP protocol")
    parser.add_argument("--processes", type=int, default=1, help="serve from this many processes on one port")
    args = parser.parse_args()
    serve(args.ready_file, args.app, http=args.http, processes=args.processes)


if __name__ == "__main__":
    main()
