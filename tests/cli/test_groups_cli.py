"""`lakebroker groups list|seek` on pull groups: positions, lag, and every way to move a group,
beside a running server whose HTTP routes read and write the same offsets table."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tests.cli.test_topics_cli import lakebroker
from tests.servers import ServerProcess


def _listed(data: Path, *args: str) -> list[dict[str, Any]]:
    done = lakebroker(data, "groups", "list", "--json", *args)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _positions(data: Path, group: str) -> dict[int, tuple[int, int, str]]:
    """partition -> (committed offset, lag, reason)"""
    return {r["partition"]: (r["committed_offset"], r["lag"], r["reason"])
            for r in _listed(data, "--group", group)}


def _moved(url: str, data: Path, *args: str) -> dict[int, int]:
    """Seek, and the new positions as the server's GET answers them."""
    done = lakebroker(data, "groups", "seek", *args)
    assert done.returncode == 0, done.stderr
    topic, group = args[:2]
    answer = httpx.get(f"{url}/v1/topics/{topic}/groups/{group}/offsets").json()
    return {int(p): o for p, o in answer["offsets"].items()}


def test_list_and_seek_every_way_beside_a_running_server(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data)
    url = server.start()
    try:
        assert httpx.post(f"{url}/v1/topics", json={"name": "t", "partitions": 2}).status_code == 201
        early = [{"value": f"early-{i}", "partition": 0} for i in range(3)] + [{"value": "early-3", "partition": 1}]
        assert httpx.post(f"{url}/v1/topics/t/batch?ack=table", json={"messages": early}).status_code == 200
        time.sleep(0.05)
        between = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        time.sleep(0.05)
        late = [{"value": f"late-{i}", "partition": 0} for i in range(2)]
        assert httpx.post(f"{url}/v1/topics/t/batch?ack=table", json={"messages": late}).status_code == 200
        assert _listed(data) == []  # no group yet

        # A consumer's own commits over HTTP show in the list, with their lag.
        for group, offset in (("readers", 3), ("others", 1)):
            commit = httpx.post(f"{url}/v1/topics/t/groups/{group}/offsets", json={"offsets": {"0": offset}})
            assert commit.status_code == 200, commit.text
        assert [(r["group"], r["partition"], r["committed_offset"], r["lag"], r["reason"])
                for r in _listed(data, "--topic", "t")] == [("others", 0, 1, 4, "ack"), ("readers", 0, 3, 2, "ack")]

        assert _moved(url, data, "t", "g", "--to", "latest") == {0: 5, 1: 1}
        assert _positions(data, "g") == {0: (5, 0, "seek"), 1: (1, 0, "seek")}
        assert _moved(url, data, "t", "g", "--timestamp", between) == {0: 3, 1: 1}  # partition 1: none after -> end
        assert _moved(url, data, "t", "g", "--to", "earliest") == {0: 0, 1: 0}
        assert _moved(url, data, "t", "g", "--offset", "1=1") == {0: 0, 1: 1}  # partition 0 keeps its position
        assert _positions(data, "g") == {0: (0, 5, "seek"), 1: (1, 0, "seek")}
        assert _positions(data, "readers")[0] == (3, 2, "ack")  # another group is not moved

        dry = lakebroker(data, "groups", "seek", "t", "g", "--offset", "0=4", "--dry-run")
        assert dry.returncode == 0 and "would move group g on t: 1 partition(s)" in dry.stdout

        # Refused, nothing moved: out of the log, malformed, two ways at once, an unknown topic, a bad time.
        past = lakebroker(data, "groups", "seek", "t", "g", "--offset", "0=6")
        assert past.returncode == 1 and "valid positions are 0 (its log start) to 5 (its end)" in past.stderr
        for bad in (["--offset", "0=-1"], ["--to", "latest", "--offset", "0=1"]):
            refused = lakebroker(data, "groups", "seek", "t", "g", *bad)
            assert refused.returncode == 2 and refused.stderr.startswith("error: "), (bad, refused.stderr)
        unknown = lakebroker(data, "groups", "seek", "nope", "g", "--to", "earliest")
        assert unknown.returncode == 1 and "topic 'nope' does not exist" in unknown.stderr
        bad_time = lakebroker(data, "groups", "seek", "t", "g", "--timestamp", "yesterday")
        assert bad_time.returncode == 1 and "neither epoch milliseconds nor ISO 8601" in bad_time.stderr
        offsets = httpx.get(f"{url}/v1/topics/t/groups/g/offsets").json()["offsets"]
        assert offsets == {"0": 0, "1": 1}  # the dry run and the refusals moved nothing
    finally:
        server.stop()
