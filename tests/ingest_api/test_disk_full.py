"""A full disk answers a clear 507, loses nothing acknowledged, and recovers once space returns."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ingest_api import create_app
from ingest_api.wal import ZERO_AHEAD
from tables.settings import Settings

pytestmark = pytest.mark.fault


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(path: Path) -> None:
    with path.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_disk_full_gives_507_then_recovers(small_disk: Path) -> None:
    settings = Settings(data_dir=small_disk / "data", flush_interval_ms=20)
    with TestClient(create_app(settings)) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1})
        before = client.post("/v1/topics/orders/messages?ack=table", json={"value": "before", "id": "a"})
        assert before.status_code == 200
        ballast = small_disk / "ballast"
        fill(ballast)
        # The WAL's room zeroed ahead of its last group (ingest_api/wal.py) still takes a few.
        big = "x" * 100_000
        accepted = 0
        for _ in range(ZERO_AHEAD // len(big) + 2):
            refused = client.post("/v1/topics/orders/messages", json={"value": big})
            if refused.status_code != 200:
                break
            accepted += 1
        assert refused.status_code == 507, refused.text
        assert "disk full" in refused.json()["error"]["message"]
        ballast.unlink()
        after = client.post("/v1/topics/orders/messages?ack=table", json={"value": "after", "id": "b"})
        assert after.status_code == 200, after.text
        assert after.json()["offset"] == 1 + accepted  # the refused send left no gap
        assert client.get("/readyz").status_code == 200
        read = client.get("/v1/topics/orders/partitions/0/messages", params={"offset": 0}).json()
        values = [m["value"] for m in read["messages"]]
        assert values[0] == "before" and values[-1] == "after" and len(values) == 2 + accepted


def test_delta_commit_on_full_disk_is_retried_and_nothing_is_lost(small_disk: Path) -> None:
    import time

    settings = Settings(data_dir=small_disk / "data", flush_interval_ms=1500)
    with TestClient(create_app(settings)) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1})
        acked = client.post("/v1/topics/orders/messages", json={"value": "in the WAL"})
        assert acked.status_code == 200
        ballast = small_disk / "ballast"
        fill(ballast)  # before the flusher's first commit
        deadline = time.monotonic() + 20
        while client.get("/readyz").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        not_ready = client.get("/readyz")
        assert not_ready.status_code == 503
        assert "Delta commits are failing" in " ".join(not_ready.json()["problems"])
        ballast.unlink()
        while time.monotonic() < deadline:
            body = client.get("/v1/topics/orders/partitions/0/messages", params={"offset": 0}).json()
            if body["messages"]:
                break
            time.sleep(0.1)
        assert [m["value"] for m in body["messages"]] == ["in the WAL"]
        assert client.get("/readyz").status_code == 200
