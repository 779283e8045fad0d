"""The dedup index's memory and per-operation cost at the default 2,000,000 ids.

    python -m bench.dedup_memory            # writes docs/benchmarks-dedup.md (`make bench` includes it)
    python -m bench.dedup_memory --quick    # 500,000 ids

Each figure comes from a fresh child process that fills an index to its max_entries: the
product's `DedupIndex`, and as the comparison row a plain OrderedDict of (topic id, id) →
(partition, offset, timestamp) tuples with the same eviction. Per index, one child measures
with tracemalloc and another without it (tracemalloc's own bookkeeping would count in the RSS);
a last child holds both indexes and times their operations in alternating rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from bench.memory import status_mb
from bench.procs import REPO
from lakebroker.ingest_api.dedup import DedupIndex, DedupKey, Placed

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


def memory(kind: str, n: int, traced: bool) -> dict[str, float]:
    """One index filled to n ids (its max_entries), measured in this process."""
    now_us = int(time.time() * 1_000_000)
    if traced:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        index = filled(kind, n, now_us)
        return {"traced_bytes": tracemalloc.get_traced_memory()[0] - before}
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


def run(quick: bool) -> str:
    n = 500_000 if quick else 2_000_000
    load = os.getloadavg()[0]
    results = {kind: {**child(["--child", kind, "--entries", str(n)]),
                      **child(["--child", kind, "--entries", str(n), "--traced"])} for kind in KINDS}
    for kind, costs in child(["--timing", "--entries", str(n)]).items():
        results[kind].update(costs)
    compact = results["compact"]
    lines = [
        "## Dedup index: memory and cost per operation",
        "",
        f"Command: `python -m bench.dedup_memory{' --quick' if quick else ''}` (also run by `make bench`; "
        f"{datetime.now(UTC):%Y-%m-%d}, this {os.cpu_count()}-core machine, load average {load:.1f} at the start). "
        f"An index is filled to its max_entries, {n:,} ids (UUID-shaped message ids over four topics, each "
        "with a partition, an offset and a log-append time), in a fresh process: bytes per id by tracemalloc "
        "and as the process's RSS growth, the RSS peak while filling (growing copies the arrays) and the CPU "
        "time per id of the fill. Then, with both indexes full in one process and their rounds alternating, "
        f"the CPU time per operation (medians of {ROUNDS} rounds of {OPS:,}): a lookup of a known id (a retried "
        "send), and for a new id the broker's sequence, a lookup that misses, begin and remember, which "
        "evicts the oldest id (each new message that carries an id). The comparison row is a plain "
        "OrderedDict of tuples with the same eviction, measured in the same run.",
        "",
        f"<!-- headline: dedup index, {n:,} ids: {compact['traced_bytes'] / n:.0f} B per id (tracemalloc), "
        f"{compact['rss_mb']:.0f} MB of RSS; lookup {compact['hit_us']:.2f} µs, new id {compact['new_us']:.2f} µs -->",
        "",
        "| index | B per id (tracemalloc) | RSS growth, MB (B per id) | RSS peak growth | fill, µs per id "
        "| lookup, known id | new id |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, r in results.items():
        lines.append(
            f"| {KINDS[kind][0]} | {r['traced_bytes'] / n:,.0f} | {r['rss_mb']:,.0f} ({r['rss_mb'] * 2**20 / n:,.0f}) "
            f"| {r['peak_mb']:,.0f} MB | {r['fill_us']:.2f} | {r['hit_us']:.2f} µs | {r['new_us']:.2f} µs |")
    lines += [
        "",
        "`DedupIndex` keeps a 128-bit hash of each key, its partition, offset and time in fixed-width arrays, "
        "with a slot table at most half full; the arrays double as ids arrive, up to `dedup_max_entries`, so "
        "an idle broker holds little. Its RSS growth exceeds what tracemalloc counts by what the C heap keeps "
        "of the arrays freed at each doubling, and its peak is the last doubling, with both copies held. The "
        "ingest target for all of serve is 300 MB of RSS. CPU times are from a shared machine: compare the "
        "rows of one run.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="500,000 ids instead of 2,000,000")
    parser.add_argument("--child", choices=sorted(KINDS), help=argparse.SUPPRESS)
    parser.add_argument("--entries", type=int, default=2_000_000, help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child or args.timing:
        print(json.dumps(memory(args.child, args.entries, args.traced) if args.child else timing(args.entries)))
        return
    text = run(args.quick)
    Path(FRAGMENT).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
