"""Tables on S3 (a local MinIO, scripts/s3_server.sh): what object storage costs the data path.

    python -m bench.s3                 # writes docs/benchmarks-s3.md (`make bench` includes it)
    python -m bench.s3 --quick

Three figures, each from one run on this machine with the server on loopback:
1. Flush to S3: the flusher's commit (Flusher.flush_once: Arrow conversion, txn check, delta-rs
   append with conditional put) beside a bare delta-rs append of the same rows already in Arrow
   form, to the same bucket, in the same run: rows/s and commit latency per batch size.
2. produce → visible with the tables on S3, at the default flush settings: `lakebroker serve`
   with LAKEBROKER_TABLES_URI on the bucket, a steady producer (ack=wal), and a reader that
   follows the table's Delta log (TopicLogTail, as delivery does); per message, from the send to
   the first refresh showing its offset.
3. Replication local → bucket: `replication.run` of a local topic to a bucket prefix, table bytes
   copied per second of the run (the Spark session is started before the clock).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow as pa
from prometheus_client import CollectorRegistry

from bench.flush import PARTITIONS, _Source
from bench.procs import REPO, lakebroker_server
from lakebroker.ingest_api.flusher import Flusher, records_to_arrow
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicStore, ensure_topic_table, new_topic
from scripts.s3_process import start

FRAGMENT = REPO / "docs" / "benchmarks-s3.md"
ACCESS_KEY, SECRET_KEY = "lakebroker", "lakebroker-secret"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


@dataclass
class FlushFigure:
    records: int
    flush_ms: list[float]
    floor_ms: list[float]
    arrow_ms: list[float]  # records_to_arrow alone: the flusher's Python share, no I/O

    def rate(self, ms: list[float]) -> float:
        return self.records / (statistics.median(ms) / 1e3)


async def _flush(root: str, work: Path, sizes: list[int], repeats: int) -> list[FlushFigure]:
    settings = Settings(data_dir=work / "flush", tables_uri=root)
    topic = new_topic("flushbench", PARTITIONS, max_message_bytes=1 << 20)
    flusher = Flusher(settings, Layout.of(settings), lambda: {topic.name: topic}, IngestMetrics(CollectorRegistry()),
                      lambda: None)
    source = _Source(topic.name, bytes.fromhex(topic.topic_id))
    floor = ensure_topic_table(f"{root}/floor")
    flusher.add(source.take(300))  # creates and opens the table outside the timing
    if not await flusher.flush_once():
        raise RuntimeError("the flusher could not commit its warm-up batch")
    out = []
    for n in sizes:
        figure = FlushFigure(n, [], [], [])
        for _ in range(repeats):
            records = source.take(n)
            started = time.perf_counter()
            arrow = records_to_arrow(records)
            figure.arrow_ms.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            floor.update_incremental()
            delta.append(floor, arrow)
            figure.floor_ms.append((time.perf_counter() - started) * 1e3)
            flusher.add(records)
            started = time.perf_counter()
            if not await flusher.flush_once():
                raise RuntimeError(f"the flusher failed to commit a batch of {n}")
            figure.flush_ms.append((time.perf_counter() - started) * 1e3)
        out.append(figure)
    return out


@dataclass
class Visibility:
    sent: int
    visible_ms: list[float]
    flush_interval_ms: int


def _visibility(root: str, work: Path, env: dict[str, str], rate: float, seconds: float) -> Visibility:
    data = work / "serve"
    server = lakebroker_server(data, env={**env, "LAKEBROKER_TABLES_URI": root, "LAKEBROKER_DELIVER_IN_SERVE": "false",
                                          **{f"LAKEBROKER_{j}_INTERVAL_S": "0" for j in (
                                              "COMPACTION", "RETENTION", "KEY_COMPACTION", "OFFSETS_COMPACTION",
                                              "REPLICATION")}})
    with server:
        r = httpx.post(f"{server.url}/v1/topics", json={"name": "vis", "partitions": 1}, timeout=30)
        r.raise_for_status()
        sent_at: dict[int, float] = {}
        seen_at: dict[int, float] = {}
        done = threading.Event()

        def follow() -> None:
            tail = TopicLogTail(Layout(data, root).topic_table("vis"))
            while not done.is_set():
                tail.refresh()
                end = tail.txn(delta.partition_app_id(0)) or 0
                now = time.perf_counter()
                for offset in range(len(seen_at), end):
                    seen_at.setdefault(offset, now)
                time.sleep(0.005)

        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        with httpx.Client(base_url=server.url, timeout=10) as client:
            step = 1.0 / rate
            start_t = time.perf_counter()
            for i in range(int(rate * seconds)):
                due = start_t + i * step
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                sent = time.perf_counter()
                reply = client.post("/v1/topics/vis/messages?ack=wal", json={"value": {"i": i}})
                reply.raise_for_status()
                sent_at[reply.json()["offset"]] = sent
        deadline = time.monotonic() + 30
        while len(seen_at) < len(sent_at) and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()
        watcher.join(5)
    latencies = [(seen_at[o] - t) * 1e3 for o, t in sent_at.items() if o in seen_at]
    if len(latencies) != len(sent_at):
        raise RuntimeError(f"{len(sent_at) - len(latencies)} acknowledged messages never became visible")
    return Visibility(len(sent_at), latencies, Settings().flush_interval_ms)


@dataclass
class Replication:
    rows: int
    table_bytes: int
    seconds: float  # the run that copied the table
    idle_seconds: float  # the next run, with nothing new to copy: the fixed cost of a run
    local_seconds: float  # the same copy to a local directory, in the same session

    @property
    def mb_s(self) -> float:
        return self.table_bytes / 1e6 / self.seconds

    @property
    def net_mb_s(self) -> float:
        return self.table_bytes / 1e6 / max(self.seconds - self.idle_seconds, 1e-3)


def _replication(s3_uri: str, work: Path, rows: int) -> Replication:
    from lakebroker.spark_pipeline.jobs import replication
    from lakebroker.spark_pipeline.session import DEFAULT_JARS_DIR, build_spark_session

    settings = Settings(data_dir=work / "primary", spark_master="local[2]")
    layout = Layout.of(settings)
    TopicStore(layout).create(new_topic("orders", PARTITIONS))
    table = delta.load(layout.topic_table("orders"))
    source = _Source("orders", b"\0" * 16)
    per_commit = 50_000
    for _ in range(max(1, rows // per_commit)):
        batch = records_to_arrow(source.take(per_commit))
        # Random values: Parquet would squeeze the usual constant ones to almost nothing.
        noise = pa.array([os.urandom(100) for _ in range(per_commit)], pa.binary())
        batch = batch.set_column(batch.schema.get_field_index("value"), "value", noise)
        ends = {delta.partition_app_id(p): source.next[p] for p in range(PARTITIONS)}
        table.update_incremental()
        delta.append(table, batch, txns=ends)
    actions = pa.table(delta.load(layout.topic_table("orders")).get_add_actions(flatten=True))
    size = int(pa.compute.sum(actions["size_bytes"]).as_py() or 0)
    spark = build_spark_session(master="local[2]", jars_dir=DEFAULT_JARS_DIR, app_name="bench-s3")
    try:
        started = time.perf_counter()
        result = replication.run(spark, settings, "orders", to=s3_uri)
        seconds = time.perf_counter() - started
        started = time.perf_counter()
        replication.run(spark, settings, "orders", to=s3_uri)
        idle = time.perf_counter() - started
        started = time.perf_counter()
        local = replication.run(spark, settings, "orders", to=str(work / "local-replica"))
        local_s = time.perf_counter() - started
    finally:
        spark.stop()
    copied = int(result.table("orders").details.get("rows_copied") or 0)
    if copied != sum(source.next):
        raise RuntimeError(f"replication copied {copied} of {sum(source.next)} rows: {result.public()}")
    if int(local.table("orders").details.get("rows_copied") or 0) != copied:
        raise RuntimeError(f"the local replication copied a different count: {local.public()}")
    return Replication(copied, size, seconds, idle, local_s)


def render(flush: list[FlushFigure], vis: Visibility, rep: Replication, command: str) -> str:
    lines = [
        "## Tables on S3",
        "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, this 2-core machine, MinIO built by "
        "`scripts/s3_server.sh` and serving on 127.0.0.1). Every table, the flusher's and the bare "
        "append's, is in the same bucket; commits are conditional PUTs (`If-None-Match: *`).",
        "",
        "**Flush to S3.** The flusher's commit beside a bare delta-rs append of the same rows (already Arrow), "
        "to the same bucket, alternating, medians of the repeats:",
        "",
        "| rows per commit | flusher rows/s | flusher commit ms (p50 / p99) | bare append rows/s "
        "| bare append ms (p50 / p99) | flusher / bare | records_to_arrow alone rows/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in flush:
        lines.append(
            f"| {f.records:,} | {f.rate(f.flush_ms):,.0f} | {statistics.median(f.flush_ms):.1f} / "
            f"{pct(f.flush_ms, 0.99):.1f} | {f.rate(f.floor_ms):,.0f} | {statistics.median(f.floor_ms):.1f} / "
            f"{pct(f.floor_ms, 0.99):.1f} | {f.rate(f.flush_ms) / f.rate(f.floor_ms):.2f} "
            f"| {f.rate(f.arrow_ms):,.0f} |")
    lines += [
        "",
        f"**produce → visible, tables on S3**, default flush settings (flush_interval_ms = {vis.flush_interval_ms}): "
        f"{vis.sent} messages at a steady rate, ack=wal, each timed from its send to the first refresh of a "
        "reader following the table's Delta log that shows it: "
        f"p50 {pct(vis.visible_ms, 0.5):.0f} ms, p99 {pct(vis.visible_ms, 0.99):.0f} ms, "
        f"max {max(vis.visible_ms):.0f} ms (target: p99 ≤ 1000 ms).",
        "",
        f"**Replication local → bucket**: {rep.rows:,} rows with random 100-byte values "
        f"({rep.table_bytes / 1e6:.1f} MB of Parquet) copied by one `replication.run` in {rep.seconds:.1f} s: "
        f"{rep.mb_s:.2f} MB/s for the whole run. The next run, with nothing to copy, took {rep.idle_seconds:.1f} s "
        "(the fixed cost of a run: the streaming query's start, the log-start follow-up, VACUUM, the replica's "
        f"checkpoint); net of it, {rep.net_mb_s:.2f} MB/s. The same copy to a local directory, in the same "
        f"session, took {rep.local_seconds:.1f} s ({rep.table_bytes / 1e6 / rep.local_seconds:.2f} MB/s). "
        "Spark local[2], its session started before the clock.",
        "",
    ]
    return "\n".join(lines)


def run(quick: bool) -> str:
    sizes, repeats = ([1_000, 10_000], 8) if quick else ([1_000, 10_000, 50_000], 20)
    rate, seconds = (50.0, 10.0) if quick else (100.0, 30.0)
    rows = 100_000 if quick else 500_000
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        work = Path(tmp)
        server = start(work / "minio", ACCESS_KEY, SECRET_KEY)
        saved = {k: os.environ.get(k) for k in server.env}
        os.environ.update(server.env)
        try:
            flush = asyncio.run(_flush(server.uri("flush"), work, sizes, repeats))
            vis = _visibility(server.uri("serve"), work, server.env, rate, seconds)
            rep = _replication(server.uri("replica"), work, rows)
        finally:
            server.stop()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return render(flush, vis, rep, "python -m bench.s3" + (" --quick" if quick else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=FRAGMENT)
    args = p.parse_args()
    text = run(args.quick)
    args.out.write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
