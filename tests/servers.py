"""Real `lakebroker serve` processes on loopback, for end-to-end and crash tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

REPO = Path(__file__).resolve().parent.parent


class ServerProcess:
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.log = data_dir.parent / f"{data_dir.name}-server.log"

    def start(self, timeout: float = 60) -> str:
        server_file = self.data_dir / "server.json"
        server_file.unlink(missing_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lakebroker", "--data-dir", str(self.data_dir), "serve", "--port", "0"],
                stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            if server_file.exists():
                try:
                    self.url = orjson.loads(server_file.read_bytes())["url"]
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

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
