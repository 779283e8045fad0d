"""Fault injection, long form: SIGKILL `serve` under produce load, cycle after cycle, then count.

Every acknowledged message must be in the table once, at its acknowledged offset, with dense offsets per
partition. tests/ingest_api/test_crash.py runs `crash_cycles` in a short form. Every load loop is bounded in time.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from deltalake import DeltaTable

from bench.result import Check, Mode, Result, Scenario, table
from tests.servers import ServerProcess

PARTITIONS = 3
CYCLES = {"full": 20, "quick": 5, "tiny": 1}


@dataclass
class CrashReport:
    cycles: int
    acknowledged: int
    stored: int
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    gaps: list[int] = field(default_factory=list)  # partitions whose offsets are not dense
    seconds: float = 0.0


async def _produce(url: str, acked: dict[str, tuple[int, int]], counter: itertools.count[int]) -> None:
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


async def _load_then_kill(server: ServerProcess, acked: dict[str, tuple[int, int]], counter: itertools.count[int],
                          seconds: float) -> None:
    tasks = [asyncio.create_task(_produce(server.url, acked, counter)) for _ in range(12)]
    # Under load first (a busy machine can take seconds to answer the first requests), then a
    # random moment later the kill.
    before, deadline = len(acked), time.monotonic() + 60
    while len(acked) - before < 150 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(seconds)
    server.kill()  # mid-load: requests in flight, groups mid-fsync, flushes mid-commit
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def crash_cycles(data: Path, cycles: int, seed: int = 7) -> CrashReport:
    started = time.monotonic()
    server = ServerProcess(data, env={"LAKEBROKER_FLUSH_INTERVAL_MS": "50", "LAKEBROKER_DELIVER_IN_SERVE": "0"})
    url = server.start()
    httpx.post(url + "/v1/topics", json={"name": "crash", "partitions": PARTITIONS}).raise_for_status()
    acked: dict[str, tuple[int, int]] = {}
    counter = itertools.count()
    rng = random.Random(seed)
    try:
        for _ in range(cycles):
            asyncio.run(_load_then_kill(server, acked, counter, rng.uniform(0.8, 2.0)))
            server.start()
        with httpx.Client(base_url=server.url) as client:  # one acknowledged write after the last restart
            r = client.post("/v1/topics/crash/messages?ack=table", json={"id": "final", "value": "final"})
            acked["final"] = (r.json()["partition"], r.json()["offset"])
    finally:
        server.stop()
    rows = DeltaTable(str(data / "topics" / "crash")).to_pyarrow_table(
        columns=["partition", "offset", "message_id"]).to_pylist()
    by_id: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        by_id.setdefault(row["message_id"], []).append((row["partition"], row["offset"]))
    report = CrashReport(cycles=cycles, acknowledged=len(acked), stored=len(rows))
    report.lost = [i for i in acked if i not in by_id]
    report.moved = [i for i, where in acked.items() if i in by_id and by_id[i] != [where]]
    report.duplicated = [i for i, where in by_id.items() if len(where) > 1]
    for p in range(PARTITIONS):
        offsets = sorted(r["offset"] for r in rows if r["partition"] == p)
        if offsets != list(range(len(offsets))):
            report.gaps.append(p)
    report.seconds = time.monotonic() - started
    return report


def measure(mode: Mode, work: Path) -> Result:
    r = crash_cycles(work / "data", CYCLES[mode])
    lost, dup, moved, gaps = len(r.lost), len(r.duplicated), len(r.moved), len(r.gaps)
    notes = []
    if r.stored > r.acknowledged:
        notes.append(f"The table holds {r.stored - r.acknowledged:,} rows more than were acknowledged: messages "
                     "written to the WAL whose answer the kill cut off are still stored (never acknowledged, so a "
                     "producer would retry them with the same id and get `duplicate: true`).")
    return Result(
        scenario="faults",
        checks=[Check("acknowledged messages lost", lost, "messages", 0, higher_is_better=False),
                Check("messages stored more than once", dup, "messages", 0, higher_is_better=False),
                Check("messages not at their acknowledged offset", moved, "messages", 0, higher_is_better=False),
                Check("partitions with offset gaps", gaps, "partitions", 0, higher_is_better=False)],
        headlines=[f"{r.cycles} SIGKILLs of serve under produce load: {r.acknowledged:,} messages acknowledged, "
                   f"{lost} lost, {dup} duplicated, {moved} moved, {gaps} partitions with gaps"],
        tables=[table("", ["cycles", "messages acknowledged", "rows in the table", "lost", "duplicated",
                           "not at the acknowledged offset", "partitions with offset gaps", "seconds"],
                      [[r.cycles, f"{r.acknowledged:,}", f"{r.stored:,}", lost, dup, moved, gaps,
                        f"{r.seconds:.0f}"]])],
        notes=notes,
        figures={"cycles": r.cycles, "acknowledged": r.acknowledged, "stored": r.stored, "lost": r.lost[:20],
                 "duplicated": r.duplicated[:20], "moved": r.moved[:20], "gaps": r.gaps, "seconds": r.seconds},
    )


SCENARIO = Scenario(
    name="faults", title="Fault injection (long form)", measure=measure, timeout_s=900,
    setup=f"One `lakebroker serve` (flush interval 50 ms, delivery off) with a topic of {PARTITIONS} partitions.",
    load="12 concurrent producers: single messages with ack=wal, and batches of 5 with ack=wal or ack=table. At a "
         "random moment 0.8-2 s into each cycle (after at least 150 new acknowledgements), serve is SIGKILLed, then "
         "restarted; 20 cycles (5 in the quick run), then one acknowledged write after the last restart.",
    metric="Every acknowledged (id, partition, offset) looked up in the topic's Delta table after the last cycle.",
    target="No acknowledged message lost, duplicated or at another offset than acknowledged; every partition's "
           "offsets dense.",
)
