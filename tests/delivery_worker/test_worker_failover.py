"""Two delivery worker processes share a subscription; one is SIGKILLed mid-stream.
Delivery continues on the survivor with no gap, and no partition is ever delivered by
both at once."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.receivers import Receiver
from tests.servers import REPO, ServerProcess
from tests.waiting import eventually

pytestmark = pytest.mark.fault

PARTITIONS = 4
FAST = {"LAKEBROKER_LEASE_TTL_S": "3", "LAKEBROKER_HEARTBEAT_S": "0.5", "LAKEBROKER_OFFSET_COMMIT_INTERVAL_MS": "200",
        "LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1", "LAKEBROKER_FLUSH_INTERVAL_MS": "50"}


def start_worker(data: Path, name: str) -> subprocess.Popen[bytes]:
    log = (data.parent / f"{name}.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "deliver", "--worker-id",
                             name], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **FAST}, cwd=REPO)


def test_sigkill_one_of_two_workers_loses_nothing(tmp_path: Path, receiver: Receiver) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data, env={**FAST, "LAKEBROKER_DELIVER_IN_SERVE": "0"})
    url = server.start()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        client = httpx.Client(base_url=url, timeout=30)
        assert client.post("/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201
        assert client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                                      "start": "earliest", "ordering": "partition"}).status_code == 201
        workers = [start_worker(data, "worker-a"), start_worker(data, "worker-b")]
        produced = 0

        def produce(n: int) -> None:
            nonlocal produced
            r = client.post("/v1/topics/orders/batch?ack=table",
                            json={"messages": [{"value": produced + i} for i in range(n)]})
            assert r.status_code == 200
            produced += n

        def owners() -> set[str]:
            produce(20)
            return {r.headers["lakebroker-worker"] for r in list(receiver.received)}

        eventually(lambda: owners() == {"worker-a", "worker-b"}, 60, what="both workers delivering", interval=0.2)
        for _ in range(10):
            produce(20)
        workers[0].send_signal(signal.SIGKILL)  # mid-stream
        killed_at = time.time()
        workers[0].wait(timeout=10)
        for _ in range(20):
            produce(20)
            time.sleep(0.05)

        def delivered() -> set[tuple[int, int]]:
            return {(m["partition"], m["offset"]) for m in receiver.messages()}

        receiver.wait_for(lambda: len(delivered()) >= produced, timeout=60)
        got = delivered()
        offsets = client.get("/v1/topics/orders").json()["partition_offsets"]
        ends = {p["partition"]: p["log_end_offset"] for p in offsets}
        assert sum(ends.values()) == produced
        for p, end in ends.items():
            assert {o for q, o in got if q == p} == set(range(end)), f"partition {p} has a gap"

        # No partition was delivered by both workers at once. In arrival order, a partition's
        # deliveries form a few runs, one per owner (handoffs happen as workers join and die);
        # within a run offsets only rise, and each new owner resumes at or before the previous
        # owner's next offset. Two owners at once would interleave into many short runs.
        for p in range(PARTITIONS):
            seq = [(r.headers["lakebroker-worker"], int(r.headers["lakebroker-offset"]))
                   for r in sorted(list(receiver.received), key=lambda r: r.at)
                   if int(r.headers["lakebroker-partition"]) == p]
            runs: list[list[tuple[str, int]]] = []
            for item in seq:
                if runs and runs[-1][-1][0] == item[0]:
                    runs[-1].append(item)
                else:
                    runs.append([item])
            assert len(runs) <= 3, f"partition {p} changed hands {len(runs) - 1} times: {[r[0][0] for r in runs]}"
            for run in runs:
                offsets = [o for _, o in run]
                assert offsets == sorted(set(offsets)), f"partition {p}: offsets went back within one owner"
            for before, after in itertools.pairwise(runs):
                assert after[0][1] <= before[-1][1] + 1, f"partition {p}: a handoff skipped offsets"
            assert seq[-1][0] == "worker-b", f"partition {p} was still delivered by the killed worker at the end"
        del killed_at
        # Every partition ends fully committed on the survivor.
        status = eventually(lambda: (s := client.get("/v1/subscriptions/hooks").json())
                            and not any(p["lag"] for p in s["partitions"]) and s, 20, what="no lag", interval=0.2)
        assert [p["lag"] for p in status["partitions"]] == [0] * PARTITIONS
        assert {p["owner"] for p in status["partitions"]} == {"worker-b"}
        # SIGTERM stops the survivor gracefully: offsets committed, leases released at once.
        workers[1].send_signal(signal.SIGTERM)
        assert workers[1].wait(timeout=30) == 0
        status = client.get("/v1/subscriptions/hooks").json()
        assert {p["owner"] for p in status["partitions"]} == {None}
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
                w.wait(timeout=30)
        server.stop()
