"""Tables on S3 (a local MinIO, scripts/s3_server.sh): what object storage costs the data path.
The flusher's commit to a bucket beside a bare delta-rs append there; produce → visible with `lakebroker
serve`'s tables in the bucket; and `replication.run` of a local topic to the bucket, in MB/s.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow as pa
from prometheus_client import CollectorRegistry

from bench.harness.servers import NO_JOBS, lakebroker_server
from bench.result import Check, Mode, Result, Scenario, table
from bench.scenarios.flush import PARTITIONS, _Source, _to_arrow
from lakebroker.ingest_api.flusher import Flusher
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicStore, ensure_topic_table, new_topic
from scripts.s3_process import start

ACCESS_KEY, SECRET_KEY = "lakebroker", "lakebroker-secret"
TARGET_VISIBLE_P99_MS = 1000.0


@dataclass(frozen=True)
class Sizes:
    flush_sizes: tuple[int, ...]  # rows per commit
    repeats: int
    rate: float  # messages per second, produce → visible
    seconds: float
    replicated_rows: int  # in commits of 50,000


SIZES: dict[str, Sizes] = {
    "full": Sizes((1_000, 10_000, 50_000), 20, 100.0, 30.0, 500_000),
    "quick": Sizes((1_000, 10_000), 8, 50.0, 10.0, 100_000),
    "tiny": Sizes((1_000,), 2, 20.0, 2.0, 50_000),
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


@dataclass
class FlushFigure:
    records: int
    flush_ms: list[float]
    floor_ms: list[float]
    arrow_ms: list[float]  # the flusher's Arrow assembly alone (chunks_to_arrow): its Python share, no I/O

    def rate(self, ms: list[float]) -> float:
        return self.records / (statistics.median(ms) / 1e3)


async def _flush(root: str, work: Path, sizes: tuple[int, ...], repeats: int) -> list[FlushFigure]:
    settings = Settings(data_dir=work / "flush", tables_uri=root)
    topic = new_topic("flushbench", PARTITIONS, max_message_bytes=1 << 20)
    flusher = Flusher(settings, Layout.of(settings), lambda: {topic.name: topic}, IngestMetrics(CollectorRegistry()),
                      lambda: None)
    flusher.own(topic)
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
            arrow = _to_arrow(records)
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
                                          **NO_JOBS})
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

    @property
    def local_mb_s(self) -> float:
        return self.table_bytes / 1e6 / self.local_seconds


def _replication(s3_uri: str, work: Path, rows: int) -> Replication:
    from lakebroker.spark_pipeline.jobs import replication
    from lakebroker.spark_pipeline.session import build_spark_session
    from lakebroker.tables.user_cache import jars_dir

    settings = Settings(data_dir=work / "primary", spark_master="local[2]")
    layout = Layout.of(settings)
    TopicStore(layout).create(new_topic("orders", PARTITIONS))
    table = delta.load(layout.topic_table("orders"))
    source = _Source("orders", b"\0" * 16)
    per_commit = 50_000
    for _ in range(max(1, rows // per_commit)):
        batch = _to_arrow(source.take(per_commit))
        # Random values: Parquet would squeeze the usual constant ones to almost nothing.
        noise = pa.array([os.urandom(100) for _ in range(per_commit)], pa.binary())
        batch = batch.set_column(batch.schema.get_field_index("value"), "value", noise)
        ends = {delta.partition_app_id(p): source.next[p] for p in range(PARTITIONS)}
        table.update_incremental()
        delta.append(table, batch, txns=ends)
    actions = pa.table(delta.load(layout.topic_table("orders")).get_add_actions(flatten=True))
    size = int(pa.compute.sum(actions["size_bytes"]).as_py() or 0)
    spark = build_spark_session(master="local[2]", jars_dir=jars_dir(), app_name="bench-s3")
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


def result(flush: list[FlushFigure], vis: Visibility, rep: Replication) -> Result:
    p50, p99, worst = pct(vis.visible_ms, 0.5), pct(vis.visible_ms, 0.99), max(vis.visible_ms)
    big = max(flush, key=lambda f: f.records)
    rows = [[f"{f.records:,}", f"{f.rate(f.flush_ms):,.0f}",
             f"{statistics.median(f.flush_ms):.1f} / {pct(f.flush_ms, 0.99):.1f}", f"{f.rate(f.floor_ms):,.0f}",
             f"{statistics.median(f.floor_ms):.1f} / {pct(f.floor_ms, 0.99):.1f}",
             f"{f.rate(f.flush_ms) / f.rate(f.floor_ms):.2f}", f"{f.rate(f.arrow_ms):,.0f}"] for f in flush]
    return Result(
        scenario="s3",
        checks=[Check("produce → visible p99, tables on S3", p99, "ms", TARGET_VISIBLE_P99_MS, higher_is_better=False,
                      baseline=f"p50 {p50:.0f} ms, flush_interval_ms = {vis.flush_interval_ms}")],
        headlines=[f"produce → visible on S3: p50 {p50:.0f} ms, p99 {p99:.0f} ms; flush to S3 "
                   f"{big.rate(big.flush_ms):,.0f} rows/s at {big.records:,} rows per commit; replication "
                   f"{rep.mb_s:.2f} MB/s ({rep.net_mb_s:.2f} net of an idle run)"],
        tables=[
            table("Flush to S3: the flusher's commit beside a bare delta-rs append of the same rows (already Arrow), "
                  "to the same bucket, alternating; medians of the repeats.",
                  ["rows per commit", "flusher rows/s", "flusher commit ms (p50 / p99)", "bare append rows/s",
                   "bare append ms (p50 / p99)", "flusher / bare", "Arrow assembly alone rows/s"], rows),
        ],
        notes=[
            f"**produce → visible**: {vis.sent:,} messages, each timed from its send to the first refresh of the "
            f"reader that shows it: p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {worst:.0f} ms "
            f"(flush_interval_ms = {vis.flush_interval_ms}).",
            f"**Replication local → bucket**: {rep.rows:,} rows ({rep.table_bytes / 1e6:.1f} MB of Parquet) copied "
            f"in {rep.seconds:.1f} s: {rep.mb_s:.2f} MB/s for the whole run. The next run, with nothing to copy, "
            f"took {rep.idle_seconds:.1f} s (the fixed cost of a run: the streaming query's start, the log-start "
            f"follow-up, VACUUM, the replica's checkpoint); net of it, {rep.net_mb_s:.2f} MB/s. The same copy to a "
            f"local directory took {rep.local_seconds:.1f} s ({rep.local_mb_s:.2f} MB/s).",
        ],
        figures={"flush": [vars(f) for f in flush], "replication": vars(rep),
                 "visibility": {"sent": vis.sent, "flush_interval_ms": vis.flush_interval_ms, "p50_ms": p50,
                                "p99_ms": p99, "max_ms": worst}},
    )


def measure(mode: Mode, work: Path) -> Result:
    sizes = SIZES[mode]
    server = start(work / "minio", ACCESS_KEY, SECRET_KEY)
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        flush = asyncio.run(_flush(server.uri("flush"), work, sizes.flush_sizes, sizes.repeats))
        vis = _visibility(server.uri("serve"), work, server.env, sizes.rate, sizes.seconds)
        rep = _replication(server.uri("replica"), work, sizes.replicated_rows)
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return result(flush, vis, rep)


_FULL = SIZES["full"]
SCENARIO = Scenario(
    name="s3", title="Tables on S3", measure=measure,
    setup="MinIO built by `make setup` (scripts/s3_server.sh), serving one bucket on 127.0.0.1; every table below "
          "is in it, and commits are conditional PUTs (`If-None-Match: *`).",
    load=f"Flush: batches of {', '.join(f'{n:,}' for n in _FULL.flush_sizes)} rows, {_FULL.repeats} of each, as "
         "the columnar produce path leaves them over 3 partitions, committed by `Flusher.flush_once` and, "
         "alternating, by a bare delta-rs append of the same rows already in Arrow form. produce → visible: "
         f"`lakebroker serve` (delivery and Spark jobs off, default flush settings) with LAKEBROKER_TABLES_URI in "
         f"the bucket, sent {_FULL.rate:.0f} messages/s for {_FULL.seconds:.0f} s (ack=wal) while a reader follows "
         f"the table's Delta log (TopicLogTail, as delivery does). Replication: {_FULL.replicated_rows:,} rows "
         "with random 100-byte values copied by `replication.run` (Spark local[2], its session started before "
         "the clock) from a local topic to the bucket, then run again with nothing to copy, then to a local "
         "directory. Quick runs are shorter and smaller.",
    metric="Flush: rows/s and commit ms (p50 / p99), the flusher against the bare append. produce → visible: per "
           "message, from its send to the reader's first refresh showing its offset. Replication: table bytes "
           "copied per second of the run, whole and net of the idle run.",
    target=f"produce → visible p99 ≤ {TARGET_VISIBLE_P99_MS:,.0f} ms with the tables on S3.",
)
