"""Several ingest nodes on one table root: real `lakebroker serve` processes sharing a local tables
directory (tests/spark_pipeline/test_s3_cluster.py runs three on the local S3 server).

Each test reads the cluster through GET /v1/cluster and the topic tables through delta-rs, and
checks what a producer cares about: every message answered once, at its Kafka partition, with
offsets dense per partition across every change of owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from deltalake import DeltaTable

from lakebroker.ingest_api.partitioner import partition_for_key
from tests.servers import NO_SCHEDULED_JOBS, ServerProcess, alive, children, until

pytestmark = [pytest.mark.timeout(300)]

TTL_S = 4.0  # renewals every half TTL: room for a slow commit beside the whole suite
PARTITIONS = 4


def _env(root: Path, **extra: str) -> dict[str, str]:
    return {"LAKEBROKER_TABLES_URI": str(root), "LAKEBROKER_INGEST_LEASE_TTL_S": str(TTL_S),
            "LAKEBROKER_INGEST_HEARTBEAT_S": "0.2", **extra}


def keys_by_partition(partitions: int) -> dict[int, str]:
    """A key for each partition, by Kafka's murmur2."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < partitions:
        keys.setdefault(partition_for_key(f"k{i}", partitions), f"k{i}")
        i += 1
    return keys


KEYS = keys_by_partition(PARTITIONS)


def _cluster(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/cluster", timeout=10)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _owners(url: str, topic: str = "orders") -> dict[int, str | None]:
    return {p["partition"]: p["url"] for p in _cluster(url)["partitions"] if p["topic"] == topic}


def _balanced(url: str, nodes: set[str]) -> bool:
    owners = _owners(url)
    counts = Counter(owners.values())
    return len(owners) == PARTITIONS and set(counts) == nodes and max(counts.values()) - min(counts.values()) <= 1


def _offsets(root: Path, topic: str = "orders") -> dict[int, list[int]]:
    rows = DeltaTable(str(root / "topics" / topic)).to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
    out: dict[int, list[int]] = {}
    for r in rows:
        out.setdefault(r["partition"], []).append(r["offset"])
    return {p: sorted(o) for p, o in out.items()}


def _produce(url: str, key: str, n: int, ack: str = "table", **fields: Any) -> httpx.Response:
    """As a producer does: a 503 (the partition between owners, a second at most) is retried."""
    deadline = time.monotonic() + 30
    while True:
        r = httpx.post(f"{url}/v1/topics/orders/messages", params={"ack": ack},
                       json={"key": key, "value": {"n": n}, **fields}, timeout=30)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        assert r.json()["error"]["code"] == "partition_unavailable" and r.headers["retry-after"] == "1"
        time.sleep(0.2)


def _cli(root: Path, node: ServerProcess, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(node.data_dir), *args],
                          capture_output=True, text=True, timeout=120, env={**node.env, "COLUMNS": "200"})
    assert not check or done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Path, ServerProcess, ServerProcess]]:
    root = tmp_path / "tables"
    a, b = ServerProcess(tmp_path / "a", _env(root)), ServerProcess(tmp_path / "b", _env(root))
    try:
        a.start()
        b.start()
        yield root, a, b
    finally:
        a.stop()
        b.stop()


def test_two_nodes_share_partitions_forward_and_fail_over(nodes: tuple[Path, ServerProcess, ServerProcess]) -> None:
    root, a, b = nodes
    assert {n["url"] for n in _cluster(a.url)["nodes"] if n["alive"]} == {a.url, b.url}
    assert httpx.post(f"{a.url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
    until(lambda: httpx.get(f"{b.url}/v1/topics/orders").status_code == 200, "b sees the topic", timeout=5)
    until(lambda: _balanced(a.url, {a.url, b.url}), "two partitions each", timeout=15)
    owners = _owners(b.url)
    assert owners == _owners(a.url), "both nodes tell the same owners"

    # Keyed messages reach their Kafka partition through either node: forwarded when the other owns it.
    for url in (a.url, b.url):
        for p, key in KEYS.items():
            r = _produce(url, key, p)
            assert r.status_code == 200, r.text
            assert r.json()["partition"] == p
    # A batch over every partition, through one node: one answer, in request order.
    batch = [{"key": KEYS[i % PARTITIONS], "value": f"m{i}"} for i in range(40)]
    r = httpx.post(f"{a.url}/v1/topics/orders/batch", params={"ack": "table"}, json={"messages": batch}, timeout=30)
    assert r.status_code == 200, r.text
    assert [x["partition"] for x in r.json()["results"]] == [i % PARTITIONS for i in range(40)]
    # Keyless messages stay on the node that took them: no hop.
    mine = {p for p, url in owners.items() if url == b.url}
    for _ in range(6):
        r = httpx.post(f"{b.url}/v1/topics/orders/messages", params={"ack": "table"}, json={"value": "keyless"})
        assert r.status_code == 200 and r.json()["partition"] in mine, r.text
    # A forwarded request is not forwarded again: its node answers 421 with the owner.
    theirs = next(p for p, url in owners.items() if url == a.url)
    r = httpx.post(f"{b.url}/v1/topics/orders/messages", json={"key": KEYS[theirs], "value": 1},
                   headers={"lakebroker-forwarded-by": "test"})
    assert r.status_code == 421 and a.url in r.json()["error"]["message"], r.text
    offsets = _offsets(root)
    assert all(o == list(range(len(o))) for o in offsets.values()), "dense from 0 in each partition"
    before = sum(len(o) for o in offsets.values())
    assert before == 2 * PARTITIONS + 40 + 6

    # `lakebroker cluster`: what the table shows, and a partition moved by hand (then back to the plan).
    shown = orjson.loads(_cli(root, a, "cluster", "show", "--json").stdout)
    ids = {n["url"]: n["id"] for n in shown["nodes"]}
    assert {n["partitions"] for n in shown["nodes"]} == {PARTITIONS // 2} and len(ids) == 2
    assert not any(n["draining"] for n in shown["nodes"]), "both serve"
    moved = theirs  # a's
    assert "pinned to" in _cli(root, a, "cluster", "move", "orders", str(moved), "--to", ids[b.url]).stdout
    until(lambda: _owners(a.url)[moved] == b.url, "the partition moved to b", timeout=10)
    assert _produce(a.url, KEYS[moved], 0).json()["partition"] == moved
    refused = _cli(root, a, "cluster", "move", "orders", "9", "--to", ids[b.url], check=False)
    assert refused.returncode == 1 and "partitions 0 to 3" in refused.stderr
    refused = _cli(root, a, "cluster", "move", "orders", "0", "--to", "nobody", check=False)
    assert refused.returncode == 1 and "no live node 'nobody'" in refused.stderr
    assert _cli(root, a, "cluster", "move", "orders", "0", check=False).returncode == 2
    _cli(root, a, "cluster", "move", "orders", str(moved), "--auto")
    until(lambda: _balanced(a.url, {a.url, b.url}), "balanced again", timeout=10)
    owners = _owners(a.url)
    offsets = _offsets(root)
    assert all(o == list(range(len(o))) for o in offsets.values())
    before = sum(len(o) for o in offsets.values())

    # Messages with ids, sent through b: a places its partitions' share.
    first = {p: _produce(b.url, key, p, id=f"retry-{p}").json() for p, key in KEYS.items()}
    before += PARTITIONS

    # SIGKILL a: b takes its partitions within the lease's TTL, with new epochs, and goes on densely.
    epochs = {p["partition"]: p["epoch"] for p in _cluster(b.url)["partitions"]}
    a.kill()
    killed = time.monotonic()
    until(lambda: set(_owners(b.url).values()) == {b.url}, "b owns every partition", timeout=TTL_S + 10)
    assert time.monotonic() - killed < TTL_S + 3
    after = {p["partition"]: p["epoch"] for p in _cluster(b.url)["partitions"]}
    assert {p for p in after if after[p] > epochs[p]} == {p for p, url in owners.items() if url == a.url}
    for p, key in KEYS.items():
        assert _produce(b.url, key, p).status_code == 200
        # A retry of a message the dead node placed gets its first answer from the new owner.
        again = _produce(b.url, key, p, id=f"retry-{p}").json()
        assert again["duplicate"] and again["offset"] == first[p]["offset"], (again, first[p])
    offsets = _offsets(root)
    assert all(o == list(range(len(o))) for o in offsets.values())
    assert sum(len(o) for o in offsets.values()) == before + PARTITIONS

    # a comes back with its data dir and gets its share again while b takes a steady stream: the
    # partitions move with no gap and no duplicate.
    answers: list[dict[str, Any]] = []
    refused: list[str] = []
    stop = threading.Event()

    def stream() -> None:
        n = 0
        while not stop.is_set() and n < 2000 and not refused:
            r = _produce(b.url, KEYS[n % PARTITIONS], n, id=f"join-{n}")
            if r.status_code != 200:
                refused.append(f"{r.status_code} {r.text}")
                return
            answers.append(r.json())
            n += 1

    producer = threading.Thread(target=stream)
    producer.start()
    try:
        a.start()
        joined = len(answers)
        until(lambda: _balanced(b.url, {a.url, b.url}), "rebalanced after a's return", timeout=20)
        until(lambda: len(answers) >= joined + 5 or bool(refused), "messages after the join", timeout=60)
    finally:
        stop.set()
        producer.join(timeout=60)
    assert not refused, refused
    for p, key in KEYS.items():
        assert _produce(a.url, key, p).status_code == 200
    offsets = _offsets(root)
    assert all(o == list(range(len(o))) for o in offsets.values()), "dense across the move"
    assert sum(len(o) for o in offsets.values()) == before + 2 * PARTITIONS + len(answers), "each once"
    assert len({(x["partition"], x["offset"]) for x in answers}) == len(answers)
    assert httpx.delete(f"{b.url}/v1/topics/orders").status_code == 204
    until(lambda: httpx.get(f"{a.url}/v1/topics/orders").status_code == 404, "a forgets the topic", timeout=5)
    assert _produce(a.url, KEYS[0], 0).status_code == 404


def _serve(data: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_data_dir_or_node_id_in_use_is_refused_with_a_clear_error(
        nodes: tuple[Path, ServerProcess, ServerProcess], tmp_path: Path) -> None:
    """Two processes must never write one WAL, nor heartbeat as one node: a second `serve` on a's
    data dir, `--workers 2` on it, and a copy of b's data dir (its node id) each exit 1 with a
    sentence saying what to do, before serving anything."""
    _, a, b = nodes
    for args in ((), ("--workers", "2")):
        done = _serve(a.data_dir, a.env, *args)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"another lakebroker process (pid {a.proc.pid if a.proc else ''}) serves the data dir" in done.stderr
        assert "Traceback" not in done.stderr
    copy = tmp_path / "copy-of-b"
    copy.mkdir()
    (copy / "node_id").write_bytes((b.data_dir / "node_id").read_bytes())
    done = _serve(copy, b.env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"is alive at {b.url}: this data dir is a copy" in done.stderr and "Traceback" not in done.stderr
    assert {n["url"] for n in _cluster(a.url)["nodes"] if n["alive"]} == {a.url, b.url}, "b's row untouched"
    # A CLI command on a data dir no server holds, beside live nodes, goes through one of them
    # rather than joining the cluster for its length.
    assert httpx.post(f"{a.url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
    until(lambda: httpx.get(f"{b.url}/v1/topics/orders").status_code == 200, "b sees the topic", timeout=5)
    cli = tmp_path / "cli"
    done = subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(cli), "produce", "orders", "hi",
                           "--key", KEYS[1], "--ack", "table"], capture_output=True, text=True, timeout=120, env=a.env)
    assert done.returncode == 0 and done.stdout.startswith("partition 1 offset 0"), done.stdout + done.stderr
    assert not (cli / "node_id").exists(), "never a node"
    assert len(_cluster(a.url)["nodes"]) == 2
    (copy / "node_id").unlink()  # as the error says: a copy for a new node forgets the old id
    c = ServerProcess(copy, b.env)
    try:
        c.start()
        until(lambda: len([n for n in _cluster(a.url)["nodes"] if n["alive"]]) == 3, "c joins as a third node")
    finally:
        c.stop()


def test_ack_wal_messages_of_a_killed_node_come_back_with_new_offsets(tmp_path: Path) -> None:
    """a acknowledges at ack=wal and dies before its flush; b takes over and commits more. When a
    restarts with its data dir, its acknowledged messages reach the table once each, at offsets
    after b's, never at offsets b used."""
    root = tmp_path / "tables"
    slow = _env(root, LAKEBROKER_FLUSH_INTERVAL_MS="600000", LAKEBROKER_FLUSH_MAX_RECORDS="1000000")
    a, b = ServerProcess(tmp_path / "a", slow), ServerProcess(tmp_path / "b", _env(root))
    try:
        a.start()
        assert httpx.post(f"{a.url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
        for p, key in KEYS.items():  # in a's WAL only: its flush is ten minutes away
            for i in range(5):
                r = _produce(a.url, key, i, ack="wal", id=f"a-{p}-{i}")
                assert r.status_code == 200 and r.json()["offset"] == i, r.text
        a.kill()
        b.start()
        until(lambda: set(_owners(b.url).values()) == {b.url}, "b owns every partition", timeout=TTL_S + 15)
        for p, key in KEYS.items():
            assert _produce(b.url, key, 100 + p).json()["offset"] == 0, "a's messages were never in the table"
        for name in ("LAKEBROKER_FLUSH_INTERVAL_MS", "LAKEBROKER_FLUSH_MAX_RECORDS"):
            a.env.pop(name)  # back to the default flush
        a.start()

        def all_there() -> bool:
            rows = DeltaTable(str(root / "topics" / "orders")).to_pyarrow_table(
                columns=["partition", "offset", "message_id"]).to_pylist()
            return sum(1 for r in rows if (r["message_id"] or "").startswith("a-")) == 5 * PARTITIONS

        until(all_there, "a's acknowledged messages in the table", timeout=30)
        rows = DeltaTable(str(root / "topics" / "orders")).to_pyarrow_table(
            columns=["partition", "offset", "message_id"]).to_pylist()
        ids = Counter(r["message_id"] for r in rows)
        assert all(ids[f"a-{p}-{i}"] == 1 for p in KEYS for i in range(5)), "each once"
        by_partition: dict[int, list[tuple[int, str | None]]] = {}
        for r in rows:
            by_partition.setdefault(r["partition"], []).append((r["offset"], r["message_id"]))
        for p, placed in by_partition.items():
            placed.sort()
            assert [o for o, _ in placed] == list(range(len(placed))), f"partition {p} is dense"
            assert placed[0][1] is None, "b's message kept offset 0"
            assert [m for _, m in placed[1:]] == [f"a-{p}-{i}" for i in range(5)], "a's, in order, after b's"
    finally:
        a.stop()
        b.stop()


def test_a_paused_owner_is_fenced_and_its_messages_land_after_the_new_owners(tmp_path: Path) -> None:
    """SIGSTOP a past its lease with acknowledged messages not yet committed; b takes over and
    commits. On SIGCONT, a's flush (planned at its old epoch) cannot land: the table refuses it or a
    reads the newer claim first. a's messages reach the table once each, after b's, at unused offsets."""
    root = tmp_path / "tables"
    a = ServerProcess(tmp_path / "a", _env(root, LAKEBROKER_FLUSH_INTERVAL_MS="3000"))
    b = ServerProcess(tmp_path / "b", _env(root))
    paused = False
    try:
        a.start()
        b.start()
        assert httpx.post(f"{a.url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
        until(lambda: _balanced(a.url, {a.url, b.url}), "two partitions each", timeout=15)
        mine = {p for p, url in _owners(a.url).items() if url == a.url}
        for p in mine:  # acknowledged from a's WAL; a commits them only after its 3 s flush interval
            for i in range(5):
                assert _produce(a.url, KEYS[p], i, ack="wal", id=f"a-{p}-{i}").status_code == 200
        assert a.proc is not None
        os.kill(a.proc.pid, signal.SIGSTOP)
        paused = True

        def rows() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = DeltaTable(str(root / "topics" / "orders")).to_pyarrow_table(
                columns=["partition", "offset", "message_id"]).to_pylist()
            return out

        # What a committed before the pause (a flush interval may have ended meanwhile): most of it not.
        done = Counter(r["partition"] for r in rows() if (r["message_id"] or "").startswith("a-"))
        assert sum(done.values()) < 5 * len(mine), "a had acknowledged messages not yet committed"
        until(lambda: set(_owners(b.url).values()) == {b.url}, "b owns every partition", timeout=TTL_S + 15)
        for p, key in KEYS.items():
            r = _produce(b.url, key, p, id=f"b-{p}")
            assert r.status_code == 200 and r.json()["offset"] == done[p], r.text  # after a's commits only
        os.kill(a.proc.pid, signal.SIGCONT)
        paused = False

        until(lambda: sum((r["message_id"] or "").startswith("a-") for r in rows()) == 5 * len(mine),
              "a's acknowledged messages in the table", timeout=30)
        placed = rows()
        assert Counter(r["message_id"] for r in placed).most_common(1)[0][1] == 1, "each message once"
        for p in KEYS:
            here = sorted((r["offset"], r["message_id"]) for r in placed if r["partition"] == p)
            assert [o for o, _ in here] == list(range(len(here))), f"partition {p}: dense, no offset twice"
            assert here[done[p]][1] == f"b-{p}", "b's message kept its offset"
            if p in mine:
                assert [m for _, m in here[:done[p]] + here[done[p] + 1:]] == [f"a-{p}-{i}" for i in range(5)], \
                    "a's committed ones before b's, the rest after, in order"
        assert "have another owner now" in a.log.read_text() or "lost the lease" in a.log.read_text()
        for p, key in KEYS.items():  # a serves again
            assert _produce(a.url, key, p).status_code == 200
    finally:
        if a.proc is not None and paused:
            os.kill(a.proc.pid, signal.SIGCONT)
        a.stop()
        b.stop()


def _workers_of(parent: int) -> list[int]:
    def is_worker(pid: int) -> bool:
        try:
            return b"--reuse-port" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # it exited meanwhile
            return False

    return sorted(pid for pid in children(parent) if is_worker(pid))


def test_workers_get_a_cpu_each_only_when_there_are_enough() -> None:
    from lakebroker.workers import worker_cpus

    allowed = sorted(os.sched_getaffinity(0))
    assert worker_cpus(len(allowed), pin=True) == allowed
    assert worker_cpus(len(allowed) + 1, pin=True) == [None] * (len(allowed) + 1), "shared, never doubled up"
    assert worker_cpus(2, pin=False) == [None, None]


def _threads_on(pid: int, cpus: set[int]) -> bool:
    """Whether the Python and tokio threads of `pid` run on `cpus` (jemalloc's idle purging threads set their own)."""
    tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")
             if not Path(f"/proc/{pid}/task/{t}/comm").read_text().startswith("jemalloc")]
    return len(tasks) > 1 and all(os.sched_getaffinity(t) == cpus for t in tasks)


def test_serve_workers_share_one_port_as_nodes_and_a_dead_worker_is_restarted(tmp_path: Path) -> None:
    """Two workers (on a CPU each: this host has two) share the port as nodes; one SIGKILLed is restarted."""
    data = tmp_path / "data"
    env = {**os.environ, **NO_SCHEDULED_JOBS, "LAKEBROKER_INGEST_LEASE_TTL_S": str(TTL_S),
           "LAKEBROKER_INGEST_HEARTBEAT_S": "0.2"}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        parent = subprocess.Popen([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "serve", "--port", "0",
                                   "--workers", "2"], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        def serving() -> bool:
            try:
                url = orjson.loads((data / "server.json").read_bytes())["url"]
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except (OSError, ValueError, httpx.HTTPError):
                return False

        until(serving, "worker 0 serves", timeout=60)
        url = orjson.loads((data / "server.json").read_bytes())["url"]
        until(lambda: len([n for n in _cluster(url)["nodes"] if n["alive"]]) == 2, "two nodes", timeout=30)
        nodes = {n["url"] for n in _cluster(url)["nodes"]}
        assert url not in nodes, "each worker advertises a port of its own"
        assert httpx.post(f"{url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
        until(lambda: _balanced(url, nodes), "two partitions each", timeout=15)
        owners = _owners(url)
        # New connections land on both processes; keyless messages stay on the process that took them.
        seen: set[str | None] = set()
        for _ in range(40):
            r = httpx.post(f"{url}/v1/topics/orders/messages", params={"ack": "table"}, json={"value": "x"})
            assert r.status_code == 200, r.text
            seen.add(owners[r.json()["partition"]])
        assert seen == nodes
        assert (data / "nodes" / "1" / "wal").is_dir() and (data / "wal").is_dir()

        pids = _workers_of(parent.pid)
        assert len(pids) == 2
        cpus = sorted(os.sched_getaffinity(0))[:2]
        assert [os.sched_getaffinity(pid) for pid in pids] == [{cpus[0]}, {cpus[1]}], "a CPU each"
        assert all(_threads_on(pid, {cpu}) for pid, cpu in zip(pids, cpus, strict=True)), "its threads too"
        os.kill(pids[1], signal.SIGKILL)
        until(lambda: len(_workers_of(parent.pid)) == 2 and _workers_of(parent.pid) != pids, "a new worker",
              timeout=30)

        def restarted_on_its_cpu() -> bool:
            workers = _workers_of(parent.pid)  # (one may be between a failed start and its next one)
            try:
                return len(workers) == 2 and os.sched_getaffinity(workers[1]) == {cpus[1]}
            except ProcessLookupError:
                return False

        # It pins itself (`serve --cpu`) once its interpreter is up: beside the whole suite on two
        # cores, that start alone has taken over 30 s.
        until(restarted_on_its_cpu, "the restarted worker on its CPU", timeout=90)
        until(lambda: all(httpx.post(f"{url}/v1/topics/orders/messages", json={"key": KEYS[p], "value": 1},
                                     params={"ack": "table"}).status_code == 200 for p in KEYS),
              "every partition served again", timeout=TTL_S + 30)
        offsets = _offsets(data)
        assert all(o == list(range(len(o))) for o in offsets.values())
    finally:
        last = _workers_of(parent.pid) if parent.poll() is None else []
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert not [pid for pid in last if alive(pid)], "the workers stopped with it"
