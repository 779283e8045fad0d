"""`pip install lakebroker` (no extras) gives a working `lakebroker serve`: no Airflow, Playwright or
Spark in the venv, the scheduled Spark jobs off with a log line that says why, and commands that
need Spark stop with a one-line error naming the extra."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import orjson
import pytest

REPO = Path(__file__).resolve().parent.parent
NOT_RUNTIME = ("airflow", "playwright", "pyspark", "delta", "schemathesis", "matplotlib", "pytest")


def source_copy(into: Path) -> Path:
    """The project's sources alone, so the build writes nothing into the working tree."""
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for top in sorted({p.split(".")[0] for p in packages}):
        shutil.copytree(REPO / top, into / top, ignore=shutil.ignore_patterns("__pycache__", "java"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, into / name)
    return into


def clean_env(**extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


@pytest.mark.slow
def test_plain_install_serves_without_airflow_playwright_or_spark(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # No pip of its own (ensurepip is the slow part): this interpreter's pip installs into it, and
    # skips byte-compiling what it installs (the interpreter compiles what it imports).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py, env = venv / "bin" / "python", clean_env()
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "--quiet", "--no-compile",
                    "-c", REPO / "requirements.lock", source_copy(tmp_path / "src")], check=True, env=env, cwd=tmp_path)

    probe = f"import importlib.util as u; print([m for m in {NOT_RUNTIME!r} if u.find_spec(m)])"
    found = subprocess.run([py, "-c", probe], check=True, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert found.stdout.strip() == "[]"

    data = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        serve = subprocess.Popen([venv / "bin" / "lakebroker", "--data-dir", data, "serve", "--port", "0"],
                                 stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        url = wait_for_server(serve, data / "server.json", log_path)
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
        assert httpx.post(f"{url}/v1/topics", json={"name": "orders", "partitions": 2}).status_code == 201
        r = httpx.post(f"{url}/v1/topics/orders/messages", params={"ack": "table"},
                       json={"key": "k", "value": {"n": 1}})
        assert r.status_code == 200, r.text
        written = r.json()
        read = httpx.get(f"{url}/v1/topics/orders/partitions/{written['partition']}/messages").json()
        assert [m["value"] for m in read["messages"]] == [{"n": 1}]
        assert httpx.get(f"{url}/readyz").status_code == 200
        text = log_path.read_text()
        assert "maintenance jobs are off: scheduling compaction, retention" in text, text
        assert "pip install 'lakebroker[spark]'" in text
    finally:
        serve.terminate()
        serve.wait(timeout=60)

    sql = subprocess.run([venv / "bin" / "lakebroker", "--data-dir", tmp_path / "other", "sql", "SELECT 1"],
                         env=env, cwd=tmp_path, capture_output=True, text=True)
    assert sql.returncode == 1
    assert sql.stderr.strip().startswith("error: this command needs Spark, and pyspark is not installed"), sql.stderr
    assert "pip install 'lakebroker[spark]'" in sql.stderr and "Traceback" not in sql.stderr


def wait_for_server(proc: subprocess.Popen[bytes], server_file: Path, log: Path) -> str:
    while True:  # bounded by the test's timeout; a server that exits ends the wait at once
        assert proc.poll() is None, log.read_text()
        if server_file.exists():
            try:
                url: str = orjson.loads(server_file.read_bytes())["url"]
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    return url
            except (ValueError, KeyError, httpx.HTTPError):
                pass
        time.sleep(0.05)
