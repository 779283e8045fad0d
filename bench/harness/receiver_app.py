"""A webhook receiver for the delivery benchmarks, run as its own process.

It records every delivery it acknowledges (partition, offset, the message's log-append time,
when it arrived, and the producer's send time when the value carries one as `{"sent": ...}`)
and can misbehave on purpose: fail a share of requests with 500, answer
some with 429 + Retry-After, and let some time out. `GET /stats` returns what it recorded.

`python -m bench.receiver_app --ready-file PATH [--fail 0.3 --throttle 0.05 --hang 0.05 --hang-s 3]`
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import uvicorn

from bench.harness.baseline_app import UVICORN_SETTINGS


def build(fail: float, throttle: float, hang: float, hang_s: float, seed: int) -> Any:
    rng = random.Random(seed)
    got: list[tuple[int, int, str, float, float | None]] = []
    answers: dict[int, int] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        status, headers = 200, [(b"content-length", b"0")]
        if scope["method"] == "GET":
            out = orjson.dumps({"got": got, "answers": {str(k): v for k, v in answers.items()}})
            length = str(len(out)).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", length)]})
            await send({"type": "http.response.body", "body": out})
            return
        roll = rng.random()
        if roll < hang:
            await asyncio.sleep(hang_s)  # longer than the subscription's timeout: a timeout
            status = 504
        elif roll < hang + throttle:
            status, headers = 429, [(b"retry-after", b"1"), (b"content-length", b"0")]
        elif roll < hang + throttle + fail:
            status = 500
        else:
            now = time.time()
            envelopes = orjson.loads(body)
            for e in envelopes if isinstance(envelopes, list) else [envelopes]:
                value = e.get("value")
                sent = value.get("sent") if isinstance(value, dict) else None
                got.append((e["partition"], e["offset"], e["timestamp"], now, sent))
        answers[status] = answers.get(status, 0) + 1
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--fail", type=float, default=0.0)
    parser.add_argument("--throttle", type=float, default=0.0)
    parser.add_argument("--hang", type=float, default=0.0)
    parser.add_argument("--hang-s", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = build(args.fail, args.throttle, args.hang, args.hang_s, args.seed)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", **UVICORN_SETTINGS))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        args.ready_file.write_bytes(orjson.dumps({"url": f"http://127.0.0.1:{port}", "pid": os.getpid()}))
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
