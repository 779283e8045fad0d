"""The fault-injection long form: SIGKILL the ingest server under load, N cycles, then count.

`python -m bench.faults [--cycles 20]` writes docs/benchmarks-faults.md; tests/ingest_api/
test_crash.py runs the same routine in a short form. Every load loop is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from deltalake import DeltaTable

from tests.servers import ServerProcess

PARTITIONS = 3
REPO = Path(__file__).resolve().parent.parent


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


def run(quick: bool) -> str:
    """The markdown fragment bench.run includes: 5 cycles in quick mode, 20 in full."""
    return report(5 if quick else 20)


def report(cycles: int) -> str:
    with tempfile.TemporaryDirectory(prefix="lakebroker-faults-") as tmp:
        r = crash_cycles(Path(tmp) / "data", cycles)
    return "\n".join([
        "## Fault injection (long form)",
        "",
        f"Command: `python -m bench.faults --cycles {cycles}` (also `make fault`). A `lakebroker serve` process "
        "takes produce load from 12 concurrent producers (single messages with ack=wal, batches with ack=wal and "
        "ack=table) and is SIGKILLed at a random moment 0.8-2 s into each cycle, then restarted.",
        "",
        "| cycles | messages acknowledged | rows in the table | lost | duplicated | not at the acknowledged offset "
        "| partitions with offset gaps | seconds |",
        "|---|---|---|---|---|---|---|---|",
        f"| {r.cycles} | {r.acknowledged:,} | {r.stored:,} | {len(r.lost)} | {len(r.duplicated)} | {len(r.moved)} "
        f"| {len(r.gaps)} | {r.seconds:.0f} |",
        "",
        "Rows in the table may exceed the acknowledged count: a message written to the WAL whose answer was cut "
        "off by the kill is still stored (it was never acknowledged, so the producer would retry it with the "
        "same id and get `duplicate: true`).",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=20)
    args = parser.parse_args()
    text = report(args.cycles)
    (REPO / "docs" / "benchmarks-faults.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
