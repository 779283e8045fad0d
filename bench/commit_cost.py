"""CPU of one small flush commit as a topic table's versions pile up, with the handle kept open.

The flusher commits every `flush_interval_ms` (250 ms by default) while messages arrive, one Delta version
each, through a DeltaTable it keeps open. delta-rs (1.6) keeps such a handle's file list as one
Arrow batch per commit applied since it was loaded and re-scans them all at every commit, so the
cost of a commit grows with the handle's age. This measures the process CPU of
`lakebroker.tables.delta.append` (4 partitions x 250 rows, with the txn actions, as the flusher commits) on
two tables committed in lockstep: one through a handle opened once (delta-rs as is), one through
`lakebroker.tables.delta.KeptTable` (reloaded every RELOAD_AFTER_VERSIONS, as the flusher does). Each point
alternates the two (A-B, B-A), so the ratio holds on a noisy machine. Bounded: `--versions` of
`--commits` commits each.

Each point also reads the process's anonymous resident memory: delta-rs (1.6.6)'s jemalloc holds on
to native memory from its commits, less with the settings `tables/__init__.py` gives it
(docs/operations.md, "Memory"; docs/benchmarks.md, row 7).

    .venv/bin/python -m bench.commit_cost [--versions 20,300,600] [--commits 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from bench.memory import status_mb
from lakebroker.tables import delta
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.topics import ensure_topic_table

PARTITIONS = 4
ROWS = 250  # per partition and commit: 1,000 rows, about 100 ms of single produce at 10k msg/s
VALUE = b"v" * 100


class _Topic:
    """A topic table and the next offset of each partition, committed as the flusher does."""

    def __init__(self, uri: Path, *, reload: bool) -> None:
        self.uri = uri
        table = ensure_topic_table(str(uri))
        self.kept = delta.KeptTable(str(uri), lambda: table) if reload else None
        self.table = table
        self.next = [0] * PARTITIONS

    def commit(self) -> None:
        now = time.time_ns() // 1000
        columns: dict[str, pa.Array] = {
            "partition": pa.array([p for p in range(PARTITIONS) for _ in range(ROWS)], pa.int32()),
            "offset": pa.array([o for p in range(PARTITIONS) for o in range(self.next[p], self.next[p] + ROWS)],
                               pa.int64()),
            "timestamp": pa.array([now] * (PARTITIONS * ROWS), pa.timestamp("us", tz="UTC")),
            "key": pa.array(["user-1"] * (PARTITIONS * ROWS), pa.string()),
            "value": pa.array([VALUE] * (PARTITIONS * ROWS), pa.binary()),
            "format": pa.array(["text"] * (PARTITIONS * ROWS), pa.string()),
        }
        data = pa.table({f.name: columns.get(f.name, pa.nulls(PARTITIONS * ROWS, f.type)) for f in TOPIC_SCHEMA},
                        schema=TOPIC_SCHEMA)
        for p in range(PARTITIONS):
            self.next[p] += ROWS
        if self.kept is not None:
            self.table = self.kept.current()
        delta.append(self.table, data, txns={delta.partition_app_id(p): self.next[p] for p in range(PARTITIONS)},
                     metadata={"lakebroker.operation": "flush"})

    def cpu_per_commit_ms(self, commits: int) -> float:
        before = time.process_time()  # every thread's: delta-rs works in its own
        for _ in range(commits):
            self.commit()
        return (time.process_time() - before) * 1000 / commits


@dataclass
class Point:
    version: int
    kept_open_ms: float  # CPU per commit through one handle opened at version 0
    reloaded_ms: float  # the same through KeptTable
    rss_anon_mb: float = 0.0  # the process's anonymous RSS (not mapped files), after this point's commits

    @property
    def ratio(self) -> float:
        return self.kept_open_ms / self.reloaded_ms if self.reloaded_ms else 0.0


def measure(versions: list[int], commits: int, work: Path) -> list[Point]:
    kept_open, reloaded = _Topic(work / "kept-open", reload=False), _Topic(work / "reloaded", reload=True)
    points = []
    for target in sorted(versions):
        while kept_open.table.version() < target:
            kept_open.commit()
            reloaded.commit()
        version = kept_open.table.version()
        cost: dict[str, list[float]] = {"open": [], "reloaded": []}
        for k in range(2):  # A-B then B-A: the machine's drift falls on both
            pairs = [("open", kept_open), ("reloaded", reloaded)]
            for name, topic in pairs if k == 0 else reversed(pairs):
                cost[name].append(topic.cpu_per_commit_ms(commits))
        points.append(Point(version, sum(cost["open"]) / 2, sum(cost["reloaded"]) / 2,
                            status_mb("self", "RssAnon") or 0.0))
    return points


def report(points: list[Point], commits: int) -> str:
    lines = [f"Flush commit CPU as versions pile up ({PARTITIONS} partitions x {ROWS} rows per commit, "
             f"{2 * commits} commits per cell, process CPU of every thread; reload every "
             f"{delta.RELOAD_AFTER_VERSIONS} versions):", "",
             "| table version | handle opened once, ms/commit | KeptTable (as the flusher), ms/commit | ratio "
             "| process anon RSS, MB |",
             "|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.version} | {p.kept_open_ms:.1f} | {p.reloaded_ms:.1f} | {p.ratio:.1f}x "
                     f"| {p.rss_anon_mb:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="20,300,600", help="table versions to measure at (comma-separated)")
    parser.add_argument("--commits", type=int, default=10, help="commits per measurement")
    args = parser.parse_args(argv)
    versions = [int(x) for x in args.versions.split(",") if x.strip()]
    if not versions or min(versions) < 1 or max(versions) > 5000 or not 1 <= args.commits <= 100:
        parser.error("--versions: 1..5000 each; --commits: 1..100")
    with tempfile.TemporaryDirectory(prefix="lakebroker-commit-cost-") as work:
        print(report(measure(versions, args.commits, Path(work)), args.commits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
