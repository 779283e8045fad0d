"""SIGKILL the server during produce load, again and again: no acknowledged message is lost,
none is duplicated, and every partition's offsets stay dense.

CI runs a short form; LAKEBROKER_CRASH_CYCLES sets the cycle count for the long form.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from pathlib import Path

import httpx
from deltalake import DeltaTable

from tests.servers import ServerProcess

CYCLES = int(os.environ.get("LAKEBROKER_CRASH_CYCLES", "3"))
PARTITIONS = 3


async def produce_until_cancelled(url: str, acked: dict[str, tuple[int, int]], counter: itertools.count) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while True:
            n = next(counter)
            try:
                if n % 10 == 0:  # a small batch, half of them with ack=table
                    ids = [f"m{n}-{i}" for i in range(5)]
                    ack = "table" if n % 20 == 0 else "wal"
                    r = await client.post(f"/v1/topics/crash/batch?ack={ack}",
                                          json={"messages": [{"id": i, "key": i, "value": i} for i in ids]})
                    if r.status_code == 200:
                        for i, res in zip(ids, r.json()["results"], strict=True):
                            acked[i] = (res["partition"], res["offset"])
                else:
                    r = await client.post("/v1/topics/crash/messages", json={"id": f"m{n}", "value": n})
                    if r.status_code == 200:
                        acked[f"m{n}"] = (r.json()["partition"], r.json()["offset"])
            except httpx.HTTPError:
                await asyncio.sleep(0.01)  # the server is down: the send is unacknowledged


async def load_then_kill(server: ServerProcess, acked: dict[str, tuple[int, int]], counter: itertools.count,
                         seconds: float) -> None:
    tasks = [asyncio.create_task(produce_until_cancelled(server.url, acked, counter)) for _ in range(12)]
    await asyncio.sleep(seconds)
    server.kill()  # mid-load: requests are in flight, groups are mid-fsync, flushes mid-commit
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_sigkill_under_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data, env={"LAKEBROKER_FLUSH_INTERVAL_MS": "50"})
    url = server.start()
    assert httpx.post(url + "/v1/topics", json={"name": "crash", "partitions": PARTITIONS}).status_code == 201
    acked: dict[str, tuple[int, int]] = {}
    counter = itertools.count()
    rng = random.Random(7)
    try:
        for _ in range(CYCLES):
            asyncio.run(load_then_kill(server, acked, counter, rng.uniform(0.8, 2.0)))
            server.start()
        with httpx.Client(base_url=server.url) as client:  # one last acknowledged write after the last restart
            r = client.post("/v1/topics/crash/messages?ack=table", json={"id": "final", "value": "final"})
            acked["final"] = (r.json()["partition"], r.json()["offset"])
    finally:
        server.stop()

    assert len(acked) > 100 * CYCLES, f"the load acknowledged only {len(acked)} messages"
    rows = DeltaTable(str(data / "topics" / "crash")).to_pyarrow_table(
        columns=["partition", "offset", "message_id"]).to_pylist()
    by_id: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        by_id.setdefault(row["message_id"], []).append((row["partition"], row["offset"]))
    lost = [i for i in acked if i not in by_id]
    moved = [i for i, where in acked.items() if i in by_id and by_id[i] != [where]]
    duplicated = [i for i, where in by_id.items() if len(where) > 1]
    assert lost == [], f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
    assert duplicated == [], f"{len(duplicated)} messages stored twice, e.g. {duplicated[:5]}"
    assert moved == [], f"{len(moved)} messages not at their acknowledged offset, e.g. {moved[:5]}"
    for p in range(PARTITIONS):
        offsets = sorted(o for part, o in ((r["partition"], r["offset"]) for r in rows) if part == p)
        assert offsets == list(range(len(offsets))), f"partition {p} offsets are not dense"
