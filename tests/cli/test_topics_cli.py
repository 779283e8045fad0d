"""Topic commands without Spark: create, describe, delete, embedded and against a running server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.servers import ServerProcess


def lakebroker(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(data), *args],
                          capture_output=True, text=True, timeout=120)


def test_describe_and_delete_embedded(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert lakebroker(data, "topics", "create", "t1", "--partitions", "2").returncode == 0
    assert lakebroker(data, "produce", "t1", "x", "--partition", "1").stdout.strip() == "partition 1 offset 0"
    described = lakebroker(data, "topics", "describe", "t1")
    assert described.returncode == 0
    rows = [line.split("│")[1:-1] for line in described.stdout.splitlines() if "│" in line]
    assert [[c.strip() for c in r][:3] for r in rows] == [["0", "0", "0"], ["1", "0", "1"]]
    refused = lakebroker(data, "topics", "delete", "t1")  # no --yes, no terminal to confirm
    assert refused.returncode != 0 and lakebroker(data, "topics", "describe", "t1").returncode == 0
    assert lakebroker(data, "topics", "delete", "t1", "--yes").returncode == 0
    gone = lakebroker(data, "topics", "describe", "t1")
    assert gone.returncode == 1 and "does not exist" in gone.stderr
    assert not (data / "topics" / "t1").exists()


def test_commands_reach_a_running_server(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data)
    url = server.start()
    try:
        assert lakebroker(data, "topics", "create", "live", "--partitions", "1").returncode == 0
        produced = lakebroker(data, "produce", "live", "hello", "--ack", "table")
        assert produced.stdout.strip() == "partition 0 offset 0", produced.stderr
        body = httpx.get(url + "/v1/topics/live/partitions/0/messages").json()
        assert [m["value"] for m in body["messages"]] == ["hello"]  # the server assigned the offset
        assert lakebroker(data, "topics", "delete", "live", "--yes").returncode == 0
        assert httpx.get(url + "/v1/topics/live").status_code == 404
    finally:
        server.stop()
