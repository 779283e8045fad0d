"""bench.harness.probe: wrk's script times each request itself, so one slow answer is one slow request
(wrk's own percentiles would add samples for coordinated omission)."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from bench.harness.probe import Probe, write_script

pytestmark = pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk")
STALL_S = 0.3
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


def _serve(listener: socket.socket, stall_at: int, stop: threading.Event) -> None:
    """Answer each request at once, but the `stall_at`th after STALL_S; connections one at a time
    (wrk opens one to check the address before its own)."""
    listener.settimeout(0.2)
    answered = 0
    for _ in range(100):  # bounded: 20 s of waiting for a connection at most
        if stop.is_set():
            return
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(5)
        buffered = b""
        with conn:
            while not stop.is_set() and answered < 100_000:
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    return
                if not data:
                    break
                buffered += data
                while b"\r\n\r\n" in buffered:
                    head, _, rest = buffered.partition(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    if len(rest) < length:
                        break
                    buffered = rest[length:]
                    answered += 1
                    if answered == stall_at:
                        time.sleep(STALL_S)
                    conn.sendall(ANSWER)


def test_one_stalled_answer_is_one_slow_request(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    server = threading.Thread(target=_serve, args=(listener, 50, stop), daemon=True)
    server.start()
    try:
        port = listener.getsockname()[1]
        script = write_script(tmp_path, "probe", b'{"value": 1}', "application/json")
        result = Probe(f"http://127.0.0.1:{port}/x", script, 2).finish()
    finally:
        stop.set()
        server.join(timeout=10)
        listener.close()
    assert result.errors == 0
    assert result.requests > 100  # a closed loop on loopback: many answers in 2 s
    assert result.at_least(STALL_S * 1e3 * 0.9) == 1
    assert STALL_S * 1e3 <= result.max_ms < STALL_S * 1e3 + 200
    assert result.percentile(0.99) < 50  # wrk's corrected p99 would be about STALL_S here
