"""Delete a topic and create it again under the same name: the new topic is a new log.

Nothing of the old topic may leak into it: not its producer ids (dedup), not the flusher's
handle on the deleted table, and not its WAL records after a restart.
"""

from __future__ import annotations

import json
from pathlib import Path

from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from fastapi.testclient import TestClient

from lakebroker.server import build_app
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from tests.waiting import eventually


def _recreate(client: TestClient, name: str) -> None:
    assert client.delete(f"/v1/topics/{name}").status_code == 204
    r = client.post("/v1/topics", json={"name": name, "partitions": 1})
    assert r.status_code == 201, r.text


def _committed(client: TestClient, name: str) -> int:
    return int(client.get(f"/v1/topics/{name}").json()["partition_offsets"][0]["committed_offset"])


def _wait_committed(client: TestClient, name: str, at_least: int, within_s: float = 20.0) -> int:
    """The messages committed to the topic's table, once there are at least `at_least`."""
    return eventually(lambda: (seen := _committed(client, name)) >= at_least and seen, within_s,
                      what=f"{at_least} message(s) committed to {name!r}")


def _values(client: TestClient, name: str) -> list[object]:
    r = client.get(f"/v1/topics/{name}/partitions/0/messages", params={"offset": 0})
    assert r.status_code == 200, r.text
    return [m["value"] for m in r.json()["messages"]]


def test_a_recreated_topic_accepts_the_ids_the_deleted_one_used(client: TestClient) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 1})
    old = client.post("/v1/topics/t/messages?ack=table", json={"value": "old", "id": "abc"}).json()
    _recreate(client, "t")
    new = client.post("/v1/topics/t/messages", json={"value": "new", "id": "abc"}).json()
    assert new == {"partition": 0, "offset": 0, "duplicate": False}, f"old topic answered {old}"
    assert _wait_committed(client, "t", 1) == 1
    assert _values(client, "t") == ["new"]


def test_the_flusher_commits_to_a_recreated_table_and_keeps_serving_other_topics(client: TestClient) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 1})
    client.post("/v1/topics", json={"name": "other", "partitions": 1})
    assert client.post("/v1/topics/t/messages?ack=table", json={"value": "old"}).status_code == 200
    _recreate(client, "t")
    assert client.post("/v1/topics/t/messages", json={"value": "new"}).json()["offset"] == 0
    assert client.post("/v1/topics/other/messages", json={"value": "o"}).json()["offset"] == 0
    assert _wait_committed(client, "t", 1) == 1, "the flusher never committed to the re-created table"
    assert _wait_committed(client, "other", 1) == 1
    assert _values(client, "t") == ["new"]
    flush_errors = [line for line in client.get("/metrics").text.splitlines()
                    if line.startswith("lakebroker_flush_errors_total{")]
    assert all(line.endswith(" 0.0") for line in flush_errors), flush_errors


def test_a_restart_does_not_resurrect_the_deleted_topics_ids(settings: Settings) -> None:
    with TestClient(build_app(settings)) as c:
        c.post("/v1/topics", json={"name": "t", "partitions": 1})
        # Still in the active WAL segment at the restart, and in the deleted table.
        assert c.post("/v1/topics/t/messages?ack=table", json={"value": "old", "id": "abc"}).status_code == 200
        _recreate(c, "t")
    with TestClient(build_app(settings)) as c:
        new = c.post("/v1/topics/t/messages", json={"value": "new", "id": "abc"}).json()
        assert new == {"partition": 0, "offset": 0, "duplicate": False}
        assert _wait_committed(c, "t", 1) == 1
        assert _values(c, "t") == ["new"]
        again = c.post("/v1/topics/t/messages", json={"value": "new", "id": "abc"}).json()
        assert again == {**new, "duplicate": True}


def test_a_table_written_after_its_topic_was_deleted_is_not_inherited(client: TestClient, settings: Settings) -> None:
    """A maintenance job that commits after the topic was deleted writes its table again (rows and
    log ends of the old incarnation). Creating the topic again must start a new log, not adopt it:
    adopted, its log end (3) made the flusher drop the new topic's offsets 0-2 as already committed."""
    client.post("/v1/topics", json={"name": "t", "partitions": 1})
    for i in range(3):
        assert client.post("/v1/topics/t/messages?ack=table", json={"value": f"old{i}"}).status_code == 200
    uri = Layout(settings.data_dir).topic_table("t")
    old_rows = DeltaTable(uri).to_pyarrow_table()
    assert client.delete("/v1/topics/t").status_code == 204
    write_deltalake(uri, old_rows, mode="append", partition_by=["partition"], commit_properties=CommitProperties(
        app_transactions=[Transaction(app_id=delta.partition_app_id(0), version=3)]))  # the late job's commit
    r = client.post("/v1/topics", json={"name": "t", "partitions": 1})
    assert r.status_code == 201, r.text
    new = client.post("/v1/topics/t/messages?ack=table", json={"value": "new"})
    assert new.status_code == 200 and new.json()["offset"] == 0, new.text
    assert _values(client, "t") == ["new"]


def test_a_job_that_commits_to_the_deleted_table_after_the_topic_is_created_again_cannot_reach_it(
        client: TestClient, settings: Settings) -> None:
    """A job read the old table, the topic was deleted and created again, then the job committed
    its next version (compaction's, say). At the old place that version would have landed in the
    new topic's log, past a gap no reader gets over; the new topic has a table of its own."""
    client.post("/v1/topics", json={"name": "t", "partitions": 1})
    for i in range(6):  # the old log runs past the new one's versions
        assert client.post("/v1/topics/t/messages?ack=table", json={"value": f"old{i}"}).status_code == 200
    first = client.get("/v1/topics/t").json()["location"]
    assert first == "topics/t"
    layout = Layout(settings.data_dir)
    stale = DeltaTable(layout.topic_table("t"))  # the job's snapshot
    _recreate(client, "t")
    for i in range(3):
        assert client.post("/v1/topics/t/messages?ack=table", json={"value": f"new{i}"}).status_code == 200
    _late_commit(stale)

    again = client.get("/v1/topics/t").json()
    assert again["location"] != first and again["location"].startswith("topics/t~"), again
    assert _values(client, "t") == ["new0", "new1", "new2"]
    assert DeltaTable(storage_join(settings, again["location"])).version() >= 0  # its own log, readable
    _recreate(client, "t")  # and the place of a re-created topic is not reused either
    assert client.get("/v1/topics/t").json()["location"] not in (first, again["location"])


def test_a_broker_restarted_after_a_late_commit_to_a_deleted_table_serves_the_topic(settings: Settings) -> None:
    with TestClient(build_app(settings)) as c:
        c.post("/v1/topics", json={"name": "t", "partitions": 1})
        for i in range(4):  # the old log runs past the new one's versions
            assert c.post("/v1/topics/t/messages?ack=table", json={"value": f"old{i}"}).status_code == 200
        stale = DeltaTable(Layout(settings.data_dir).topic_table("t"))
        _recreate(c, "t")
        assert c.post("/v1/topics/t/messages?ack=table", json={"value": "new"}).status_code == 200
        _late_commit(stale)
    with TestClient(build_app(settings)) as c:
        assert c.post("/v1/topics/t/messages?ack=table", json={"value": "after"}).json()["offset"] == 1
        assert _values(c, "t") == ["new", "after"]


def storage_join(settings: Settings, location: str) -> str:
    return str(settings.data_dir / location)


def _late_commit(stale: DeltaTable) -> None:
    """What a job's commit on a snapshot of a deleted table does: put its next version's commit file
    where that table was (Delta's put-if-absent; here nothing is there any more)."""
    log_dir = Path(stale.table_uri.removeprefix("file://")) / "_delta_log"
    log_dir.mkdir(parents=True, exist_ok=True)
    removed = [{"remove": {"path": f, "dataChange": False, "deletionTimestamp": 0}} for f in stale.file_uris()]
    commit = [{"commitInfo": {"operation": "OPTIMIZE", "readVersion": stale.version()}}, *removed]
    with (log_dir / f"{stale.version() + 1:020d}.json").open("x") as f:  # put-if-absent
        f.write("\n".join(json.dumps(a) for a in commit) + "\n")
