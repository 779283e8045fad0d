"""Start `scripts/s3_server.sh` (MinIO on loopback) as a child process, for the tests and benchmarks.

The server gets a free port and a data dir of the caller's; `env` is the AWS_* environment that
points delta-rs, pyarrow and Spark at it (tables/storage.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUCKET = "lakebroker"


@dataclass
class S3Process:
    endpoint: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes]

    def uri(self, name: str = "t") -> str:
        """A fresh prefix in the bucket."""
        return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:10]}"

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the script stops MinIO on its way out
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(work: Path, access_key: str, secret_key: str, timeout: float = 60) -> S3Process:
    """MinIO on 127.0.0.1:<free port> with its data under `work`; returns once the bucket exists."""
    port = _free_port()
    env = {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key,
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_REGION": "us-east-1"}
    work.mkdir(parents=True, exist_ok=True)
    log = work / "s3-server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "s3_server.sh"), "serve"],
                                env={**os.environ, **env, "S3_PORT": str(port), "S3_DATA_DIR": str(work / "s3"),
                                     "S3_BUCKET": BUCKET},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Process(env["AWS_ENDPOINT_URL"], env, proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "S3 endpoint:" in log.read_text(errors="replace"):
            return server
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"the S3 server did not start: {log.read_text(errors='replace')[-3000:]}")
