"""`pip install lakebroker` (no extras) gives a working `lakebroker serve`: no Airflow, Playwright or
Spark in the venv, the scheduled Spark jobs off with a log line that says why, and commands that
need Spark stop with a one-line error naming the extra. The wheel installs one import package,
`lakebroker`, so it lives beside PyTables (import name `tables`) and its uninstall leaves PyTables whole."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import httpx
import orjson
import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from tests.kafka_wire import KafkaConnection

REPO = Path(__file__).resolve().parent.parent
NOT_RUNTIME = ("airflow", "playwright", "pyspark", "delta", "schemathesis", "matplotlib", "pytest")


def source_copy(into: Path) -> Path:
    """The project's sources alone, so the build writes nothing into the working tree."""
    folders = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    for top in sorted(folders):
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
    pip = [sys.executable, "-m", "pip", "--python", py]
    subprocess.run([*pip, "install", "--quiet", "--no-compile", "-c", REPO / "requirements.lock", "tables"],
                   check=True, env=env, cwd=tmp_path)
    assert pytables_works(py, tmp_path, env) == "pytables ok"
    subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "-w", tmp_path / "dist", source_copy(tmp_path / "src")],
                   check=True, env=env, cwd=tmp_path)
    [wheel] = (tmp_path / "dist").glob("lakebroker-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        [top_level] = [n for n in archive.namelist() if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["lakebroker"]
    assert tops == {"lakebroker"}, tops
    subprocess.run([*pip, "install", "--quiet", "--no-compile", "-c", REPO / "requirements.lock", wheel],
                   check=True, env=env, cwd=tmp_path)
    assert pytables_works(py, tmp_path, env) == "pytables ok", "installing lakebroker changed PyTables"

    probe = f"import importlib.util as u; print([m for m in {NOT_RUNTIME!r} if u.find_spec(m)])"
    found = subprocess.run([py, "-c", probe], check=True, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert found.stdout.strip() == "[]"

    data = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        serve = subprocess.Popen([venv / "bin" / "lakebroker", "--data-dir", data, "serve", "--port", "0",
                                  "--kafka-port", "0"],
                                 stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        url = wait_for_server(serve, data / "server.json", log_path)
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
        assert httpx.post(f"{url}/v1/topics", json={"name": "orders", "partitions": 2}).status_code == 201
        r = httpx.post(f"{url}/v1/topics/orders/messages", params={"ack": "table"},
                       json={"key": "k", "value": {"n": 1}})
        assert r.status_code == 200, r.text
        # and the Kafka listener, on the runtime dependencies alone
        with KafkaConnection(orjson.loads((data / "server.json").read_bytes())["kafka"]) as kafka:
            versions = kafka.call(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        assert versions.error_code == 0 and versions.api_keys
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

    subprocess.run([*pip, "uninstall", "--quiet", "--yes", "lakebroker"], check=True, env=env, cwd=tmp_path)
    assert pytables_works(py, tmp_path, env) == "pytables ok", "uninstalling lakebroker broke PyTables"


PYTABLES = """
import sys, numpy, tables
with tables.open_file(sys.argv[1], "w") as f:
    f.create_array("/", "n", numpy.arange(5))
with tables.open_file(sys.argv[1]) as f:
    assert f.root.n.read().tolist() == [0, 1, 2, 3, 4]
print("pytables ok")
"""


def pytables_works(py: Path, cwd: Path, env: dict[str, str]) -> str:
    """PyTables (import name `tables`) writes and reads an HDF5 file in that venv."""
    run = subprocess.run([py, "-c", PYTABLES, cwd / "check.h5"], env=env, cwd=cwd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


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
