"""The dedup index's memory and per-operation cost at the default 2,000,000 ids.

    python -m bench.dedup_memory            # writes docs/benchmarks-dedup.md (`make bench` includes it)
    python -m bench.dedup_memory --quick    # 500,000 ids

Each figure comes from a fresh child process that fills an index to its max_entries: the
product's `DedupIndex`, and as the comparison row a plain OrderedDict of (topic id, id) →
(partition, offset, timestamp) tuples with the same eviction; a last child holds both indexes
and times their operations in alternating rounds. Then `lakebroker serve` itself is sent more ids
than its default keeps (by wrk, in batches) and restarted: its RSS with a full index, and after
the rebuild at start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from bench.memory import status_mb
from bench.procs import REPO
from lakebroker.ingest_api.dedup import DedupIndex, DedupKey, Placed
from lakebroker.tables.settings import Settings

FRAGMENT = REPO / "docs" / "benchmarks-dedup.md"
TOPICS = [f"{t:032x}" for t in (0x5F1D0C2A9B8E4F7C, 0x1B2C3D4E5F60718A, 0x99AA00BB11CC22DD, 0x0123456789ABCDEF)]
OPS = 20_000  # per timing round
ROUNDS = 5


class Index(Protocol):
    def lookup(self, key: DedupKey) -> Any: ...

    def begin(self, key: DedupKey, future: asyncio.Future[Placed]) -> None: ...

    def remember(self, key: DedupKey, placed: Placed) -> None: ...

    def __len__(self) -> int: ...


class TupleIndex:
    """The comparison row: the straightforward representation, a dict entry per id."""

    def __init__(self, *, window_s: float, max_entries: int) -> None:
        self.window_s, self.max_entries = window_s, max_entries
        self._done: OrderedDict[DedupKey, Placed] = OrderedDict()
        self._inflight: dict[DedupKey, asyncio.Future[Placed]] = {}

    def __len__(self) -> int:
        return len(self._done)

    def lookup(self, key: DedupKey) -> Placed | asyncio.Future[Placed] | None:
        hit = self._done.get(key)
        return hit if hit is not None else self._inflight.get(key)

    def begin(self, key: DedupKey, future: asyncio.Future[Placed]) -> None:
        self._inflight[key] = future

    def remember(self, key: DedupKey, placed: Placed) -> None:
        self._inflight.pop(key, None)
        self._done[key] = placed
        self._done.move_to_end(key)
        horizon_us = (time.time() - self.window_s) * 1_000_000
        while self._done:
            oldest, (_, _, at_us) = next(iter(self._done.items()))
            if at_us >= horizon_us and len(self._done) <= self.max_entries:
                break
            del self._done[oldest]


KINDS: dict[str, tuple[str, Callable[..., Index]]] = {
    "compact": ("`DedupIndex`", DedupIndex),
    "tuples": ("OrderedDict of tuples", TupleIndex),
}


def key(i: int) -> DedupKey:
    """A UUID-shaped message id, over four topics."""
    return TOPICS[i % 4], f"m:{i >> 32:08x}-{i >> 16 & 0xFFFF:04x}-4{i & 0xFFF:03x}-8000-{i:012x}"


def filled(kind: str, n: int, now_us: int) -> Index:
    index = KINDS[kind][1](window_s=3600, max_entries=n)
    remember = index.remember
    for i in range(n):
        remember(key(i), (i % 12, 10_000_000 + i, now_us + i))
    return index


def memory(kind: str, n: int) -> dict[str, float]:
    """One index filled to n ids (its max_entries), measured in this process."""
    now_us = int(time.time() * 1_000_000)
    rss_before = status_mb("self", "VmRSS") or 0.0
    started = time.process_time()
    index = filled(kind, n, now_us)
    fill_us = (time.process_time() - started) / n * 1e6
    assert len(index) == n
    rss_after, peak = status_mb("self", "VmRSS") or 0.0, status_mb("self", "VmHWM") or 0.0
    return {"rss_mb": rss_after - rss_before, "peak_mb": peak - rss_before, "fill_us": fill_us}


def timing(n: int) -> dict[str, dict[str, float]]:
    """CPU µs per operation on each full index, both in this process and their rounds alternating,
    so a busy machine weighs on both alike."""
    now_us = int(time.time() * 1_000_000)
    indexes = {kind: filled(kind, n, now_us) for kind in KINDS}
    future: asyncio.Future[Placed] = asyncio.new_event_loop().create_future()
    times: dict[str, dict[str, list[float]]] = {kind: {"hit_us": [], "new_us": []} for kind in KINDS}
    for r in range(ROUNDS):
        present = [key(i) for i in range(n - (r + 1) * OPS, n - r * OPS)]
        fresh = [key(i) for i in range(n + r * OPS, n + (r + 1) * OPS)]
        for kind in KINDS if r % 2 == 0 else reversed(KINDS):
            index = indexes[kind]
            lookup, begin, remember = index.lookup, index.begin, index.remember
            started = time.process_time()
            for k in present:  # a retried send
                lookup(k)
            times[kind]["hit_us"].append((time.process_time() - started) / OPS * 1e6)
            started = time.process_time()
            for k in fresh:  # a new message with an id, as the broker places it
                if lookup(k) is None:
                    begin(k, future)
                    remember(k, (3, 1_000_000_000, now_us))
            times[kind]["new_us"].append((time.process_time() - started) / OPS * 1e6)
    return {kind: {op: statistics.median(v) for op, v in ops.items()} for kind, ops in times.items()}


def child(argv: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "bench.dedup_memory", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=900, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# Batches of 1,000 messages, each with a UUID-shaped id no other request of the run carries.
_IDS_LUA = """-- generated by bench/dedup_memory.py
local threads = 0
setup = function(thread) thread:set("tid", threads); threads = threads + 1 end
local sent = 0
local headers = {["Content-Type"] = "application/json"}
local value = string.rep("v", 100)
request = function()
  local parts = {}
  for i = 1, 1000 do
    sent = sent + 1
    parts[i] = string.format('{"id":"%04x%04x-0000-4000-8000-%012x","value":"%s"}', RUN, tid, sent, value)
  end
  return wrk.format("POST", "/v1/topics/ids/batch", headers, '{"messages":[' .. table.concat(parts, ",") .. ']}')
end
"""
SERVE_PEAKS_MARK = "serve-peak-rss-mb:"
SERVE_CHUNK_S = 10
SERVE_MAX_CHUNKS = 30  # bounds the fill: 300 s


def serve_full_index(n: int, chunk_s: float = SERVE_CHUNK_S) -> dict[str, float]:
    """`serve` with its default dedup settings, sent n ids (more than its dedup_max_entries when n
    is the default's) in batches by wrk; its RSS then, and again after a restart rebuilds the index
    from the topic's table."""
    import httpx

    from bench.procs import NO_JOBS, create_topic, lakebroker_server
    from bench.wrk import DONE_LUA, run_wrk

    with tempfile.TemporaryDirectory(prefix="lakebroker-bench-dedup-") as tmp:
        work = Path(tmp)
        server = lakebroker_server(work / "data", env=NO_JOBS).start()
        try:
            create_topic(server.url, "ids", 3)
            idle_mb = status_mb(server.pid, "VmRSS") or 0.0
            sent = requests = errors = 0
            started = time.monotonic()
            for chunk in range(SERVE_MAX_CHUNKS):
                if sent >= n:
                    break
                script = work / f"ids-{chunk}.lua"
                script.write_text(_IDS_LUA.replace("RUN", str(chunk)) + DONE_LUA)
                result = run_wrk(server.url, script, 4, chunk_s)
                requests += result.requests
                errors += result.errors
                sent = (requests - errors) * 1000
            fill_s = time.monotonic() - started
            full = {"rss_mb": status_mb(server.pid, "VmRSS") or 0.0, "peak_mb": status_mb(server.pid, "VmHWM") or 0.0}
            ring_mb = (work / "data" / "dedup" / "dedup.ring").stat().st_size / 2**20
        finally:
            server.stop()
        started = time.monotonic()
        again = lakebroker_server(work / "data", env=NO_JOBS).start(timeout=600)
        try:
            ready_s = time.monotonic() - started
            retried = _newest_id(work / "data" / "topics" / "ids")
            retry = httpx.post(f"{again.url}/v1/topics/ids/batch", timeout=60,
                               json={"messages": [{"id": retried[2], "value": "v"}]})
            restarted = {"rss_mb": status_mb(again.pid, "VmRSS") or 0.0,
                         "peak_mb": status_mb(again.pid, "VmHWM") or 0.0}
        finally:
            again.stop()
    return {"ids_sent": sent, "errors": errors, "fill_s": fill_s, "idle_mb": idle_mb, "full_rss_mb": full["rss_mb"],
            "full_peak_mb": full["peak_mb"], "ring_mb": ring_mb, "restart_ready_s": ready_s,
            "restart_rss_mb": restarted["rss_mb"], "restart_peak_mb": restarted["peak_mb"],
            "retry_duplicate": retry.status_code == 200 and retry.json()["results"][0] == {
                "partition": retried[0], "offset": retried[1], "duplicate": True,
                "timestamp": retry.json()["results"][0]["timestamp"]}}


def _newest_id(table: Path) -> tuple[int, int, str]:
    """(partition, offset, message id) of the table's newest row in partition 0."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["partition", "offset", "message_id"],
                                                    filters=[("partition", "=", 0)])
    newest = rows.sort_by([("offset", "descending")]).slice(0, 1).to_pylist()[0]
    return newest["partition"], newest["offset"], newest["message_id"]


def run(quick: bool) -> str:
    n = 500_000 if quick else 2_000_000
    load = os.getloadavg()[0]
    results = {kind: child(["--child", kind, "--entries", str(n)]) for kind in KINDS}
    for kind, costs in child(["--timing", "--entries", str(n)]).items():
        results[kind].update(costs)
    serve = serve_full_index(n + n // 10)
    compact = results["compact"]
    verdict = ("answered as a duplicate, with its placement" if serve["retry_duplicate"]
               else "NOT answered as a duplicate of its placement")
    lines = [
        "## Dedup index: memory and cost per operation",
        "",
        f"Command: `python -m bench.dedup_memory{' --quick' if quick else ''}` (also run by `make bench`; "
        f"{datetime.now(UTC):%Y-%m-%d}, this {os.cpu_count()}-core machine, load average {load:.1f} at the start). "
        f"An index is filled to its max_entries, {n:,} ids (UUID-shaped message ids over four topics, each "
        "with a partition, an offset and a log-append time), in a fresh process: its RSS growth, the RSS peak "
        "while filling, and the CPU time per id of the fill. Then, with both indexes full in one process and "
        f"their rounds alternating, the CPU time per operation (medians of {ROUNDS} rounds of {OPS:,}): a lookup "
        "of a known id (a retried send), and for a new id the broker's sequence, a lookup that misses, begin "
        "and remember, which evicts the oldest id (each new message that carries an id). The comparison row "
        "is a plain OrderedDict of tuples with the same eviction, measured in the same run.",
        "",
        f"<!-- headline: dedup index, {n:,} ids: {compact['rss_mb'] * 2**20 / n:.0f} B of RSS per id, "
        f"{compact['rss_mb']:.0f} MB; lookup {compact['hit_us']:.2f} µs, new id {compact['new_us']:.2f} µs -->",
        "",
        "| index | RSS growth, MB (B per id) | RSS peak growth | fill, µs per id | lookup, known id | new id |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, r in results.items():
        lines.append(
            f"| {KINDS[kind][0]} | {r['rss_mb']:,.0f} ({r['rss_mb'] * 2**20 / n:,.0f}) "
            f"| {r['peak_mb']:,.0f} MB | {r['fill_us']:.2f} | {r['hit_us']:.2f} µs | {r['new_us']:.2f} µs |")
    lines += [
        "",
        "`DedupIndex` keeps in memory, per id, the low 32 bits of its 128-bit hash and its ring position in a "
        "slot table at most half full; the full hash and the placement are 40-byte records in a ring file "
        "beside the WAL (`data/dedup/`), read only when those 32 bits match. Its memory is mapped at its full "
        "size and becomes resident as ids arrive: nothing is copied to grow. CPU times are from a shared "
        "machine: compare the rows of one run.",
        "",
        "### serve with a full dedup index",
        "",
        f"`lakebroker serve` with the default `dedup_max_entries` ({Settings().dedup_max_entries:,}"
        f") is sent {serve['ids_sent']:,} message ids{'' if quick else ', more than it keeps,'} "
        f"in JSON batches of 1,000 by wrk (4 connections; {serve['fill_s']:.0f} s, {serve['errors']:,} "
        "failed requests), then restarted on the same data directory, where it rebuilds the index from the "
        "topic's table. The ingest target for serve is 300 MB of RSS.",
        "",
        f"<!-- headline: serve with a full dedup index: peak RSS {serve['full_peak_mb']:.0f} MB; "
        f"after a restart's rebuild {serve['restart_peak_mb']:.0f} MB -->",
        # read by bench.report for the ingest memory target's row
        f"<!-- {SERVE_PEAKS_MARK} full-index={serve['full_peak_mb']:.1f} restart={serve['restart_peak_mb']:.1f} -->",
        "",
        "| serve | RSS | peak RSS |",
        "|---|---:|---:|",
        f"| idle, before any id | {serve['idle_mb']:.0f} MB | |",
        f"| after {serve['ids_sent']:,} ids | {serve['full_rss_mb']:.0f} MB | {serve['full_peak_mb']:.0f} MB |",
        f"| restarted, index rebuilt ({serve['restart_ready_s']:.1f} s to ready) | {serve['restart_rss_mb']:.0f} MB "
        f"| {serve['restart_peak_mb']:.0f} MB |",
        "",
        f"The ring file: {serve['ring_mb']:.0f} MB on disk. A retried send of the newest id of partition 0 "
        f"after the restart was {verdict}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="500,000 ids instead of 2,000,000")
    parser.add_argument("--child", choices=sorted(KINDS), help=argparse.SUPPRESS)
    parser.add_argument("--entries", type=int, default=2_000_000, help=argparse.SUPPRESS)
    parser.add_argument("--timing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child or args.timing:
        print(json.dumps(memory(args.child, args.entries) if args.child else timing(args.entries)))
        return
    text = run(args.quick)
    Path(FRAGMENT).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
