"""A topic whose table cannot be read (a damaged Delta log) stops that topic only: the broker
starts, other topics produce and read, the damaged one answers 503 naming its table, its messages
acknowledged into the WAL wait there, and once the table is repaired the topic opens again with
those messages at their offsets, nothing lost, nothing twice."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from deltalake import DeltaTable

from tests.servers import ServerProcess

# The acknowledged ack=wal messages stay in the WAL: no flush before the kill.
SLOW_FLUSH = {"LAKEBROKER_FLUSH_INTERVAL_MS": "600000", "LAKEBROKER_FLUSH_MAX_RECORDS": "1000000"}


def _produce(url: str, topic: str, value: str, ack: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/topics/{topic}/messages", params={"ack": ack}, json={"value": value, "id": value},
                      timeout=30)


def _stored(table_dir: Path) -> list[tuple[int, bytes]]:
    rows = DeltaTable(str(table_dir)).to_pyarrow_table(columns=["offset", "value"]).to_pylist()
    return sorted((r["offset"], r["value"]) for r in rows)


def test_a_damaged_table_stops_its_topic_only_and_reopens_when_repaired(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data)
    url = server.start()
    for name in ("good", "bad"):
        assert httpx.post(f"{url}/v1/topics", json={"name": name, "partitions": 1}).status_code == 201
    assert _produce(url, "bad", "b0", "table").json()["offset"] == 0
    assert _produce(url, "bad", "b1", "table").json()["offset"] == 1
    assert _produce(url, "good", "g0", "table").json()["offset"] == 0
    server.stop()
    server = ServerProcess(data, env=SLOW_FLUSH)
    url = server.start()
    waiting = _produce(url, "bad", "b2", "wal")  # acknowledged, only in the WAL
    assert waiting.status_code == 200 and waiting.json()["offset"] == 2
    server.kill()

    log_dir = data / "topics" / "bad" / "_delta_log"
    newest = sorted(log_dir.glob("*.json"))[-1]
    intact = newest.read_bytes()
    newest.write_bytes(b"not json\n")  # a torn or overwritten commit

    server = ServerProcess(data)
    url = server.start()  # it starts: one topic's table does not stop the node
    try:
        assert _produce(url, "good", "g1", "table").json()["offset"] == 1
        refused = _produce(url, "bad", "b3", "table")
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "topic 'bad' is unavailable" in message and str(data / "topics" / "bad") in message
        assert "retry-after" in refused.headers
        read = httpx.get(f"{url}/v1/topics/bad/partitions/0/messages", timeout=30)
        assert read.status_code == 503 and read.json()["error"]["code"] == "topic_unavailable"
        assert httpx.get(f"{url}/v1/topics/good/partitions/0/messages", timeout=30).status_code == 200
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        assert 'lakebroker_topic_unavailable{topic="bad"} 1.0' in metrics
        assert 'lakebroker_topic_unavailable{topic="good"} 0.0' in metrics
        dashboard = httpx.get(f"{url}/v1/dashboard", timeout=30)
        assert dashboard.status_code == 200
        states = {t["name"]: t["unavailable"] for t in dashboard.json()["topics"]}
        assert states["good"] is None and "cannot be read" in states["bad"]
        described = subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "topics", "describe",
                                    "bad"], capture_output=True, text=True, timeout=120)
        assert described.returncode == 1 and "cannot be read" in described.stderr  # a clear error, no traceback
        assert "Traceback" not in described.stderr

        newest.write_bytes(intact)  # repaired (or restored from a backup)
        deadline = time.monotonic() + 30
        while (answer := _produce(url, "bad", "b3", "table")).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answer.status_code == 200, answer.text
        assert answer.json()["offset"] == 3  # after the WAL's b2, which kept its offset
        assert 'lakebroker_topic_unavailable{topic="bad"} 0.0' in httpx.get(f"{url}/metrics", timeout=30).text
        retried = _produce(url, "bad", "b2", "table")  # the producer's retry of the WAL-only message
        assert retried.json() == {"partition": 0, "offset": 2, "duplicate": True}
        retried_committed = _produce(url, "bad", "b0", "table")  # ids the table held before the damage
        assert retried_committed.json() == {"partition": 0, "offset": 0, "duplicate": True}
    finally:
        server.stop()
    assert _stored(data / "topics" / "bad") == [(0, b'b0'), (1, b'b1'), (2, b'b2'), (3, b'b3')]
    assert _stored(data / "topics" / "good") == [(0, b'g0'), (1, b'g1')]
