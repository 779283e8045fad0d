"""A real S3-compatible server (MinIO, `scripts/s3_server.sh`) on loopback, one per test process.

`make test` builds the binary (`make setup`); the fixture starts it on a free port with its data
under the session's tmp dir, points the AWS_* environment of this process at it, and every test
gets a prefix of its own in the bucket `lakebroker`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.servers import REPO, free_port

BUCKET = "lakebroker"
# Distinctive so a test can search every response and log line for them.
ACCESS_KEY = "lbtest-access-AKIA7Q"
SECRET_KEY = "lbtest-secret-Zx81pQ-never-shown"


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes]

    def uri(self, name: str = "") -> str:
        """A fresh prefix in the bucket."""
        return f"s3://{BUCKET}/{name or 't'}-{uuid.uuid4().hex[:10]}"


def start_s3(tmp: Path, timeout: float = 60) -> S3Server:
    port = free_port()
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_REGION": "us-east-1"}
    log = tmp / "s3-server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "s3_server.sh"), "serve"],
                                env={**os.environ, **env, "S3_PORT": str(port), "S3_DATA_DIR": str(tmp / "s3")},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "S3 endpoint:" in log.read_text(errors="replace"):
            return S3Server(env["AWS_ENDPOINT_URL"], env, proc)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"the S3 server did not start: {log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = start_s3(tmp_path_factory.mktemp("s3"))
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)  # delta-rs, pyarrow and Spark (tables/storage.py) read these
    try:
        yield server
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        os.killpg(server.proc.pid, signal.SIGTERM)  # the script stops MinIO on its way out
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)


@pytest.fixture
def s3_root(s3_server: S3Server) -> str:
    return s3_server.uri()


@pytest.fixture
def s3_spark(spark: Any, s3_server: S3Server) -> Any:
    """The shared Spark session, its S3A pointed at this process's server."""
    from spark_pipeline import s3a

    s3a.configure(spark)
    return spark
