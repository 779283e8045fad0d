"""Server processes on loopback for the benchmarks: start, find the URL, read CPU time, stop.

A server announces itself in a JSON file ({"url", "pid"}) once it listens: `lakebroker serve`
writes data_dir/server.json (as tests/servers.py reads it), the baseline app its --ready-file.
Every wait here is bounded in time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

from bench.harness.memory import peak_rss_mb

REPO = Path(__file__).resolve().parents[2]
_TICK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """A benchmark could not run (a server did not start, a tool failed)."""


def free_port() -> int:
    """A loopback port free now (the caller binds it soon after; nothing reserves it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], object], timeout: float, step: float = 0.5) -> bool:
    """Whether `predicate` came true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU per thread id; the main thread's id is the pid."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


@dataclass
class Server:
    """One server process; `url` and `pid` are known once `start` returns."""

    name: str
    argv: Sequence[str]
    ready_file: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/"
    url: str = ""
    pid: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> Server:
        return self.launch().wait_ready(timeout)

    def launch(self) -> Server:
        """Start the process without waiting (start several, then `wait_ready` each)."""
        self.ready_file.unlink(missing_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                list(self.argv), stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), **self.env},
            )
        return self

    def wait_ready(self, timeout: float = 60) -> Server:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if self.ready_file.exists():
                try:
                    info = orjson.loads(self.ready_file.read_bytes())
                    self.url, self.pid = info["url"], int(info["pid"])
                    if httpx.get(self.url + self.ready_path, timeout=2).status_code < 500:
                        return self
                except (ValueError, KeyError, httpx.HTTPError):
                    pass
            time.sleep(0.05)
        self.stop()
        raise BenchError(f"{self.name} not ready in {timeout}s: {self.log.read_text()[-2000:]}")

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def peak_rss_mb(self) -> float | None:
        """The server process's peak resident memory so far (its children not included)."""
        return peak_rss_mb(self.pid)

    def settle(self, quiet: float = 0.02, step: float = 0.1, timeout: float = 3.0) -> None:
        """Wait (bounded) until the server uses under `quiet` of a core: the end of a load run leaves work,
        such as logging a traceback for every request the load generator cut off, that would otherwise
        land in the next measurement."""
        deadline = time.monotonic() + timeout
        before = self.cpu()
        while time.monotonic() < deadline:
            time.sleep(step)
            now = self.cpu()
            if now - before < quiet * step:
                return
            before = now

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout)

    def __enter__(self) -> Server:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def baseline_server(work: Path, app: str = "bare", http: str | None = None, processes: int = 1) -> Server:
    name = (app if http is None else f"{app}-{http}") + ("" if processes == 1 else f"-x{processes}")
    ready = work / f"baseline-{name}.json"
    extra = ([] if http is None else ["--http", http]) + ([] if processes == 1 else ["--processes", str(processes)])
    return Server(
        name=f"baseline ({name})",
        argv=[sys.executable, "-m", "bench.harness.baseline_app", "--app", app, "--ready-file", str(ready), *extra],
        ready_file=ready, log=work / f"baseline-{name}.log",
    )


# `serve` with its scheduled Spark jobs off: the HTTP benchmarks measure a server alone on loopback, and
# a job's cold JVM (its first turn comes 5 minutes in, during a long run) would share the two cores.
NO_JOBS = {f"LAKEBROKER_{job}_INTERVAL_S": "0" for job in (
    "COMPACTION", "RETENTION", "KEY_COMPACTION", "OFFSETS_COMPACTION", "REPLICATION")}


def lakebroker_server(
    data_dir: Path, *, sampled: Path | None = None, env: dict[str, str] | None = None
) -> Server:
    """`lakebroker serve --port 0`; with `sampled`, under bench.sampler writing its profile there."""
    data_dir.mkdir(parents=True, exist_ok=True)
    cli = ["--data-dir", str(data_dir), "serve", "--port", "0", "--kafka-port", "0"]  # several may run at once
    if sampled is None:
        argv = [sys.executable, "-m", "lakebroker", *cli]
    else:
        argv = [sys.executable, "-m", "bench.harness.sampler", "--out", str(sampled), "--", *cli]
    return Server(
        name="lakebroker", argv=argv, ready_file=data_dir / "server.json",
        log=data_dir.parent / f"{data_dir.name}-server.log", env=env or {}, ready_path="/readyz",
    )


def create_topic(url: str, name: str, partitions: int = 3) -> None:
    r = httpx.post(f"{url}/v1/topics", json={"name": name, "partitions": partitions}, timeout=30)
    if r.status_code != 201:
        raise BenchError(f"creating topic {name!r} failed: {r.status_code} {r.text}")


def metrics(url: str) -> dict[str, float]:
    """Unlabelled samples of the Prometheus text at /metrics (labelled ones keyed with labels)."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out
