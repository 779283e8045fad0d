"""Real webhook receivers: HTTP servers on loopback that record what they get."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from tests.waiting import eventually


@dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


# A behaviour gets the request number (0-based) and the parsed body, and answers
# (status, extra headers, delay in seconds before answering).
Behaviour = Callable[[int, Any], tuple[int, dict[str, str], float]]


def always_ok(n: int, body: Any) -> tuple[int, dict[str, str], float]:
    return 200, {}, 0.0


@dataclass
class Receiver:
    behaviour: Behaviour = always_ok
    received: list[Received] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as separate writes; with Nagle on, the body waits for the
            # client's delayed ACK (40-200 ms a request).
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver._lock:
                    n = len(receiver.answers)
                    receiver.answers.append(-1)
                status, headers, delay = receiver.behaviour(n, orjson.loads(body) if body else None)
                if delay:
                    time.sleep(delay)
                with receiver._lock:
                    receiver.answers[n] = status
                    if 200 <= status < 300:
                        receiver.received.append(Received(time.time(), dict(self.headers.items()), body))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def messages(self) -> list[dict[str, Any]]:
        """Every acknowledged envelope, flattening batches."""
        out: list[dict[str, Any]] = []
        with self._lock:
            items = list(self.received)
        for r in items:
            body = r.json
            out.extend(body if isinstance(body, list) else [body])
        return out

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30) -> None:
        eventually(predicate, timeout, what=f"the receiver's condition ({len(self.received)} messages at the start)")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
