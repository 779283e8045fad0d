"""`serve --workers N`: what each worker advertises to other nodes and clients (lakebroker/server.py
`worker_url`), by the same rule as a single node (ingest_api/cluster.py `advertised_url`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from lakebroker.ingest_api.node_identity import advertised_url
from lakebroker.server import worker_url
from lakebroker.tables.settings import Settings
from tests.servers import NO_SCHEDULED_JOBS, REPO, until


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(socket, "getfqdn", lambda *args: "broker-7.example")
    return "broker-7.example"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_a_worker_on_a_wildcard_host_advertises_the_machines_name(machine: str, host: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, host=host, port=8080)
    assert advertised_url(settings) == f"http://{machine}:8080", "a single node's rule"
    assert [worker_url(settings, port) for port in (40001, 40002)] == [
        f"http://{machine}:40001", f"http://{machine}:40002"]


def test_a_worker_on_a_named_host_advertises_it(machine: str, tmp_path: Path) -> None:
    assert worker_url(Settings(data_dir=tmp_path, host="10.1.2.3"), 40001) == "http://10.1.2.3:40001"
    assert worker_url(Settings(data_dir=tmp_path, host="::1"), 40001) == "http://[::1]:40001"


@pytest.mark.parametrize(("url", "host"), [("http://node1.example:8080/", "node1.example"),
                                           ("https://Node1.example", "node1.example"),
                                           ("http://[fd00::7]:8080", "[fd00::7]")])
def test_an_advertised_url_gives_its_host_with_each_workers_port(machine: str, url: str, host: str,
                                                                   tmp_path: Path) -> None:
    """The worker's own port speaks plain HTTP whatever fronts the shared one."""
    settings = Settings(data_dir=tmp_path, host="0.0.0.0", port=8080, advertised_url=url)
    assert [worker_url(settings, port) for port in (40001, 40002)] == [f"http://{host}:40001",
                                                                       f"http://{host}:40002"]


def _nodes(port: int) -> list[dict[str, Any]]:
    r = httpx.get(f"http://127.0.0.1:{port}/v1/cluster", timeout=10)
    assert r.status_code == 200, r.text
    nodes: list[dict[str, Any]] = r.json()["nodes"]
    return nodes


@pytest.mark.timeout(180)
def test_workers_on_a_wildcard_host_advertise_the_machines_name(tmp_path: Path) -> None:
    """Bound to 0.0.0.0 (reached here on loopback only), neither worker advertises 0.0.0.0."""
    data = tmp_path / "data"
    env = {**os.environ, **NO_SCHEDULED_JOBS, "LAKEBROKER_AUTH": "off", "LAKEBROKER_INGEST_LEASE_TTL_S": "4",
           "LAKEBROKER_INGEST_HEARTBEAT_S": "0.2"}
    env.pop("LAKEBROKER_ADVERTISED_URL", None)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        parent = subprocess.Popen([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "serve", "--host",
                                   "0.0.0.0", "--port", "0", "--workers", "2", "--no-pin-cpus"], stdout=out,
                                  stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        def serving() -> bool:
            try:
                port = urlsplit(orjson.loads((data / "server.json").read_bytes())["url"]).port
                return port is not None and httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            except (OSError, ValueError, httpx.HTTPError):
                return False

        until(serving, "worker 0 serves", timeout=90)
        port = urlsplit(orjson.loads((data / "server.json").read_bytes())["url"]).port
        assert port is not None
        until(lambda: len([n for n in _nodes(port) if n["alive"]]) == 2, "two nodes", timeout=60)
        urls = [urlsplit(n["url"]) for n in _nodes(port)]
        assert "0.0.0.0" not in str([n["url"] for n in _nodes(port)])
        assert {u.hostname for u in urls} == {socket.getfqdn().lower()}, "the machine's name, as a single node's"
        assert len({u.port for u in urls}) == 2 and port not in {u.port for u in urls}, "a port of its own each"
    finally:
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 0, log.read_text()[-3000:]
