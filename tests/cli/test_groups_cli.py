"""`lakebroker groups list|seek` on pull groups: positions, lag, and every way to move a group,
with no server and beside a running one (whose HTTP routes read the same offsets table)."""

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


def test_seek_every_way_and_list_the_lag(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert lakebroker(data, "topics", "create", "t", "--partitions", "2").returncode == 0
    for i in range(3):
        assert lakebroker(data, "produce", "t", f"early-{i}", "--partition", "0").returncode == 0
    assert lakebroker(data, "produce", "t", "early-3", "--partition", "1").returncode == 0
    time.sleep(0.05)
    between = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    time.sleep(0.05)
    for i in range(2):
        assert lakebroker(data, "produce", "t", f"late-{i}", "--partition", "0").returncode == 0

    assert _listed(data) == []  # no group yet
    moved = lakebroker(data, "groups", "seek", "t", "g", "--to", "latest")
    assert moved.returncode == 0, moved.stderr
    assert "moved group g on t: 2 partition(s)" in moved.stdout
    assert _positions(data, "g") == {0: (5, 0, "seek"), 1: (1, 0, "seek")}

    assert lakebroker(data, "groups", "seek", "t", "g", "--timestamp", between).returncode == 0
    assert _positions(data, "g") == {0: (3, 2, "seek"), 1: (1, 0, "seek")}  # partition 1: nothing after -> end

    assert lakebroker(data, "groups", "seek", "t", "g", "--to", "earliest").returncode == 0
    assert _positions(data, "g") == {0: (0, 5, "seek"), 1: (0, 1, "seek")}

    assert lakebroker(data, "groups", "seek", "t", "g", "--offset", "1=1").returncode == 0
    assert _positions(data, "g") == {0: (0, 5, "seek"), 1: (1, 0, "seek")}  # partition 0 kept its position

    dry = lakebroker(data, "groups", "seek", "t", "g", "--offset", "0=4", "--dry-run")
    assert dry.returncode == 0 and "would move group g on t: 1 partition(s)" in dry.stdout
    assert _positions(data, "g")[0] == (0, 5, "seek")  # nothing committed

    # Refused, nothing moved: out of the log, a partition the topic lacks, malformed, ambiguous, unknown.
    past = lakebroker(data, "groups", "seek", "t", "g", "--offset", "0=6")
    assert past.returncode == 1 and "valid positions are 0 (its log start) to 5 (its end)" in past.stderr
    missing = lakebroker(data, "groups", "seek", "t", "g", "--offset", "2=0")
    assert missing.returncode == 1 and "partition 2 is out of range" in missing.stderr
    for bad in (["--offset", "0:1"], ["--offset", "0=-1"], ["--offset", "0=1", "--offset", "0=2"],
                ["--to", "latest", "--offset", "0=1"], []):
        refused = lakebroker(data, "groups", "seek", "t", "g", *bad)
        assert refused.returncode == 2, (bad, refused.stderr)
        assert refused.stderr.strip(), bad
    unknown = lakebroker(data, "groups", "seek", "nope", "g", "--to", "earliest")
    assert unknown.returncode == 1 and "topic 'nope' does not exist" in unknown.stderr
    bad_name = lakebroker(data, "groups", "seek", "t", "pull:g", "--to", "earliest")
    assert bad_name.returncode == 1 and "invalid group name" in bad_name.stderr
    bad_time = lakebroker(data, "groups", "seek", "t", "g", "--timestamp", "yesterday")
    assert bad_time.returncode == 1 and "neither epoch milliseconds nor ISO 8601" in bad_time.stderr
    assert _positions(data, "g") == {0: (0, 5, "seek"), 1: (1, 0, "seek")}


def test_groups_beside_a_running_server(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data)
    url = server.start()
    try:
        assert httpx.post(f"{url}/v1/topics", json={"name": "live", "partitions": 1}).status_code == 201
        for i in range(4):
            assert httpx.post(f"{url}/v1/topics/live/messages?ack=table", json={"value": i}).status_code == 200
        commit = httpx.post(f"{url}/v1/topics/live/groups/readers/offsets", json={"offsets": {"0": 3}})
        assert commit.status_code == 200, commit.text
        other = httpx.post(f"{url}/v1/topics/live/groups/others/offsets", json={"offsets": {"0": 1}})
        assert other.status_code == 200, other.text

        assert [(r["group"], r["committed_offset"], r["lag"], r["reason"]) for r in _listed(data, "--topic", "live")
                ] == [("others", 1, 3, "ack"), ("readers", 3, 1, "ack")]
        assert lakebroker(data, "groups", "seek", "live", "readers", "--to", "earliest").returncode == 0
        got = httpx.get(f"{url}/v1/topics/live/groups/readers/offsets").json()
        assert got["offsets"] == {"0": 0}  # the server reads the move
        assert httpx.get(f"{url}/v1/topics/live/groups/others/offsets").json()["offsets"] == {"0": 1}
    finally:
        server.stop()
