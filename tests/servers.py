"""Real `lakebroker serve` processes on loopback, for end-to-end and crash tests."""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn

from bench.harness.servers import free_port

__all__ = ["free_port"]  # one free-port helper for tests and benchmarks

REPO = Path(__file__).resolve().parent.parent
# A test server schedules no Spark jobs unless its test asks for them (env overrides this): one that
# lives through a module or the session would otherwise start JVM jobs beside every other test.
NO_SCHEDULED_JOBS = {f"LAKEBROKER_{job}_INTERVAL_S": "0"
                     for job in ("COMPACTION", "RETENTION", "KEY_COMPACTION", "OFFSETS_COMPACTION", "REPLICATION")}

LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))  # Debian's faketime package


def clock_off_env(offset_s: int) -> dict[str, str]:
    """The environment of a process whose clock is `offset_s` seconds off (libfaketime). Its
    monotonic clock moves by the same constant, which leaves every interval as it is: left alone,
    libfaketime 0.9.10 refuses every `time.sleep` of Python 3.11 (its absolute clock_nanosleep)
    with EINVAL."""
    return {"LD_PRELOAD": LIBFAKETIME[0], "FAKETIME": f"{offset_s:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "0"}


class ServerProcess:
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, port: int = 0, kafka_port: int = 0,
                 ) -> None:
        self.data_dir = data_dir
        # kafka_port 0: any free port (every test server has a Kafka listener; several run at once)
        self.env = {**os.environ, **NO_SCHEDULED_JOBS, "LAKEBROKER_KAFKA_PORT": str(kafka_port), **(env or {})}
        self.port = port  # 0: any free port; a fixed one lets a restarted server keep its URL
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.kafka = ""  # host:port of its Kafka listener
        self.log = data_dir.parent / f"{data_dir.name}-server.log"

    def start(self, timeout: float = 60) -> str:
        server_file = self.data_dir / "server.json"
        server_file.unlink(missing_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lakebroker", "--data-dir", str(self.data_dir), "serve",
                 "--port", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            if server_file.exists():
                try:
                    announced = orjson.loads(server_file.read_bytes())
                    self.url, self.kafka = announced["url"], announced.get("kafka") or ""
                    if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                        return self.url
                except (ValueError, KeyError, httpx.HTTPError):
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready in {timeout}s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int | None:
        """SIGTERM, as an init system would; the exit code (None if it was never started)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return None if self.proc is None else self.proc.returncode


@contextmanager
def serving(data_dir: Path, env: dict[str, str] | None = None, port: int = 0, kafka_port: int = 0,
            ) -> Iterator[ServerProcess]:
    """A started `serve` process, stopped on the way out."""
    node = ServerProcess(data_dir, env, port, kafka_port)
    try:
        node.start()
        yield node
    finally:
        node.stop()


def create_topic(server: ServerProcess, name: str, partitions: int = 1) -> str:
    r = httpx.post(f"{server.url}/v1/topics", json={"name": name, "partitions": partitions}, timeout=30)
    assert r.status_code == 201, r.text
    return name


def described_topic(server: ServerProcess, name: str) -> dict[str, Any] | None:
    """`GET /v1/topics/{name}`'s answer; None when there is no such topic."""
    r = httpx.get(f"{server.url}/v1/topics/{name}", timeout=30)
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    shown: dict[str, Any] = r.json()
    return shown


def stored_messages(server: ServerProcess, topic: str, partition: int) -> list[dict[str, Any]]:
    """A partition's messages as the HTTP API reads them (10,000 at most)."""
    r = httpx.get(f"{server.url}/v1/topics/{topic}/partitions/{partition}/messages", params={"limit": 10_000},
                  timeout=30)
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def children(pid: int) -> set[int]:
    """The process ids whose parent is `pid` (serve's delivery process, its scheduled jobs)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out.update(int(c) for c in (task / "children").read_text().split())
    return out


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def until(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not met in {timeout}s: {what}"
        time.sleep(0.05)


def delivery_child(server: ServerProcess, other_than: int | None = None) -> int:
    assert server.proc is not None
    found: list[int] = []

    def one() -> bool:
        found[:] = [p for p in children(server.proc.pid) if p != other_than and alive(p)]  # type: ignore[union-attr]
        return len(found) == 1

    until(one, "serve runs one delivery process")
    return found[0]

class AppThread:
    """An ASGI app (e.g. a webhook receiver) under uvicorn in a thread of the test process, on loopback."""

    def __init__(self, app: Any, **config: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, **config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def start(self, timeout: float = 30) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the app did not start")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
