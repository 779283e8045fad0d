"""Acknowledged messages without ids that leave their node: a node that lost its partitions sends its
WAL's messages of them to the new owner, and may die before its WAL lets them go. When it starts
again with that WAL, each message must still reach the table once: whether the node sends them to
the owner again or claims their partition back and appends them itself.

The WAL at that instant is taken as a copy of the node's data dir while the node is stopped with
the messages not yet sent, put back after the hand-off: the state a SIGKILL between the owner's
answer and the WAL's cleanup leaves."""

from __future__ import annotations

import os
import shutil
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable

from tests.ingest_api.test_cluster import KEYS, PARTITIONS, TTL_S, _env, _owners, _produce
from tests.servers import ServerProcess, until

pytestmark = [pytest.mark.timeout(300)]


def _rows(root: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = DeltaTable(str(root / "topics" / "orders")).to_pyarrow_table(
        columns=["partition", "offset", "value", "message_id", "producer_id", "sequence"]).to_pylist()
    return out


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, f"{name} not in /metrics"
    return values[0]


def _settled(node: ServerProcess) -> bool:
    """Nothing of another node's partitions held, nothing accepted waiting for its commit."""
    return _metric(node.url, "lakebroker_parked_messages") == 0 and \
        _metric(node.url, "lakebroker_wal_backlog_bytes") == 0


def _restore(node: ServerProcess, copy: Path) -> None:
    """Kill the node and give it its data dir as it was: as if killed between the owner's answer and
    its WAL's cleanup, with the messages it sent still in its WAL."""
    node.kill()
    shutil.rmtree(node.data_dir)
    shutil.copytree(copy, node.data_dir)


def test_messages_handed_to_the_owner_are_stored_once_after_the_sender_restarts_with_its_wal(tmp_path: Path) -> None:
    root = tmp_path / "tables"
    # a commits only after 10 s: it is stopped before then (its produce takes a second or two, and
    # over 3 s beside a busy suite), and commits what it appends again later within the waits below.
    a = ServerProcess(tmp_path / "a", _env(root, LAKEBROKER_FLUSH_INTERVAL_MS="10000"))
    b = ServerProcess(tmp_path / "b", _env(root))
    paused = False
    try:
        a.start()
        assert httpx.post(f"{a.url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
        values: list[str] = []
        for p, key in KEYS.items():  # none with an id: a batch (one columnar chunk) and singles
            batch = [{"key": key, "value": f"a-{p}-batch-{i}"} for i in range(5)]
            r = httpx.post(f"{a.url}/v1/topics/orders/batch", params={"ack": "wal"}, json={"messages": batch})
            assert r.status_code == 200, r.text
            for i in range(2):
                assert _produce(a.url, key, 0, ack="wal", value=f"a-{p}-single-{i}").status_code == 200
            values += [m["value"] for m in batch] + [f"a-{p}-single-{i}" for i in range(2)]
        assert a.proc is not None
        os.kill(a.proc.pid, signal.SIGSTOP)
        paused = True

        def stored() -> Counter[str]:
            return Counter(r["value"].decode().strip('"') for r in _rows(root))

        assert not stored(), "a's messages are in its WAL only"
        b.start()
        until(lambda: set(_owners(b.url).values()) == {b.url}, "b owns every partition", timeout=TTL_S + 15)
        for p, key in KEYS.items():
            assert _produce(b.url, key, 0, value=f"b-{p}").json()["offset"] == 0, "a never committed"
        copy = tmp_path / "a-copy"
        shutil.copytree(a.data_dir, copy)
        os.kill(a.proc.pid, signal.SIGCONT)
        paused = False
        # a sends b what it holds of b's partitions; it may claim some back and append those itself.
        until(lambda: all(stored()[v] >= 1 for v in values), "a's messages in the table", timeout=45)
        until(lambda: _settled(a), "a holds nothing of b's partitions", timeout=30)
        assert "parked messages sent to their owner" in a.log.read_text()

        # Restarted with its old WAL, a sends b those messages again: b knows them by their ids.
        _restore(a, copy)
        a.start()
        until(lambda: _settled(a), "a holds nothing of b's partitions again", timeout=30)
        assert stored() == Counter(values + [f"b-{p}" for p in KEYS]), "each message once"

        # Restarted with its old WAL again, now alone: a claims every partition and appends what it
        # holds, but for the messages b stored.
        _restore(a, copy)
        b.kill()
        a.start()
        until(lambda: set(_owners(a.url).values()) == {a.url}, "a owns every partition", timeout=TTL_S + 15)
        until(lambda: _settled(a), "a commits what it appended again", timeout=45)
        assert "stored already (by a node this node handed them to" in a.log.read_text()
        for p, key in KEYS.items():
            assert _produce(a.url, key, 0, value=f"after-{p}").status_code == 200

        assert stored() == Counter(values + [f"b-{p}" for p in KEYS] + [f"after-{p}" for p in KEYS]), \
            "each message once"
        rows = _rows(root)
        for p in KEYS:
            offsets = sorted(r["offset"] for r in rows if r["partition"] == p)
            assert offsets == list(range(len(offsets))), f"partition {p}: dense, no offset twice"
        moved = [r for r in rows if r["value"].decode().strip('"').startswith("a-")]
        assert all(r["message_id"] is None and r["producer_id"].startswith("lakebroker-node:")
                   and r["sequence"] is not None for r in moved), "a message a node hands on carries the node's id"
    finally:
        if a.proc is not None and paused:
            os.kill(a.proc.pid, signal.SIGCONT)
        a.stop()
        b.stop()


def test_a_node_killed_after_claiming_a_partition_and_before_committing_to_it_keeps_its_messages(
        tmp_path: Path) -> None:
    """A claim is not a commit: b's rows fill the partition's offsets below a's first message there,
    and a restart of a finds no WAL damage in that, only its messages to commit."""
    root = tmp_path / "tables"
    a = ServerProcess(tmp_path / "a", _env(root, LAKEBROKER_FLUSH_INTERVAL_MS="600000",
                                           LAKEBROKER_FLUSH_MAX_RECORDS="1000000"))
    b = ServerProcess(tmp_path / "b", _env(root))
    try:
        b.start()
        assert httpx.post(f"{b.url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
        for p, key in KEYS.items():
            assert _produce(b.url, key, 0, value=f"b-{p}").status_code == 200
        a.start()
        until(lambda: len(set(_owners(b.url).values())) == 2, "a takes a share of the partitions", timeout=30)
        mine = [p for p, url in _owners(b.url).items() if url == a.url]
        for p in mine:  # in a's WAL only: its flush is ten minutes away
            for i in range(3):
                r = _produce(a.url, KEYS[p], 0, ack="wal", value=f"a-{p}-{i}")
                assert r.status_code == 200 and r.json()["offset"] == 1 + i, r.text
        a.kill()
        for name in ("LAKEBROKER_FLUSH_INTERVAL_MS", "LAKEBROKER_FLUSH_MAX_RECORDS"):
            a.env.pop(name)
        a.start()
        until(lambda: _settled(a), "a commits what its WAL held", timeout=30)
        assert "WAL damage" not in a.log.read_text()
        rows = _rows(root)
        values = Counter(r["value"].decode().strip('"') for r in rows)
        assert values == Counter([f"b-{p}" for p in KEYS] + [f"a-{p}-{i}" for p in mine for i in range(3)])
        for p in KEYS:
            offsets = sorted(r["offset"] for r in rows if r["partition"] == p)
            assert offsets == list(range(len(offsets))), f"partition {p}: dense"
    finally:
        a.stop()
        b.stop()
