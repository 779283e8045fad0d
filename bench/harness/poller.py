"""Watches a topic's Delta table and records when each partition's offsets became visible.

The flusher writes, in the same Delta commit as the rows, a txn action per partition whose
version is the partition's new log-end (lakebroker.tables.delta.partition_app_id). So once a reader's
snapshot shows version v for partition p, offsets below v are readable in that snapshot. The
poller refreshes its snapshot every --interval seconds and writes each change as
[monotonic time, partition, log-end]. It stops after --duration or on SIGTERM. At the end it
reads the rows themselves and reports the offsets present, so the txn shortcut is checked
against the data.

    python -m bench.poller --table data/topics/latency --partitions 3 --duration 15 --out seen.json
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

import orjson
from deltalake import DeltaTable

from lakebroker.tables import delta


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Record when offsets become visible in a topic table.")
    parser.add_argument("--table", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--duration", type=float, required=True, help="seconds to watch")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, help="touched once the table is open and watched")
    args = parser.parse_args(argv)
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)

    start = time.monotonic()
    end = start + args.duration
    table: DeltaTable | None = None
    while table is None and time.monotonic() < end and not stop:
        table = delta.open_table(args.table)
        if table is None:
            time.sleep(args.interval)
    ends = [0] * args.partitions
    changes: list[tuple[float, int, int]] = []
    polls = 0
    apps = [delta.partition_app_id(p) for p in range(args.partitions)]
    if args.ready_file is not None:
        args.ready_file.touch()
    while table is not None and time.monotonic() < end and not stop:
        table.update_incremental()
        now = time.monotonic()
        polls += 1
        for p, app in enumerate(apps):
            v = delta.txn_version(table, app) or 0
            if v > ends[p]:
                ends[p] = v
                changes.append((now, p, v))
        time.sleep(max(0.0, args.interval - (time.monotonic() - now)))
    present: dict[str, list[int]] = {}
    if table is not None:
        rows = table.to_pyarrow_table(columns=["partition", "offset"])
        for p in range(args.partitions):
            offsets = sorted(o for q, o in zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(),
                                               strict=True) if q == p)
            present[str(p)] = [len(offsets), offsets[0] if offsets else -1, offsets[-1] if offsets else -1]
    args.out.write_bytes(orjson.dumps({
        "changes": changes, "polls": polls, "ends": ends, "present": present,
        "version": None if table is None else table.version(),
    }))


if __name__ == "__main__":
    main()
