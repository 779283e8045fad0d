"""Batch produce of 100-byte values, JSON, NDJSON and Arrow IPC, keyless and keyed, against a bare ASGI app
receiving the same bodies; and what the server's WAL and flusher did over the load (from /metrics)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow as pa

from bench.harness.compare import Measured, Target, interleave, measure
from bench.harness.servers import NO_JOBS, baseline_server, create_topic, lakebroker_server, metrics
from bench.result import Check, Mode, Result, Scenario, table
from lakebroker.ingest_api.arrow_batch import ARROW_STREAM

TARGET_MSG_S = 500_000
TARGET_KEYED_MSG_S = 200_000
TARGET_RSS_MB = 300
TARGET_ARROW_MSG_S = 2_000_000
TARGET_ARROW_KEYED_MSG_S = 1_000_000
TARGET_ARROW_OVER_JSON = 2.0  # Arrow x 5000 over JSON x 5000, keyless, same run
BATCH_PATH = "/v1/topics/bench/batch"
VALUE_100 = "v" * 100
CONNECTIONS = 4


Body = tuple[str, int]  # (json | ndjson | arrow [-keyed], messages per request)
# Measured interleaved with each other, not one after the other: their ratio is a target.
TOGETHER: tuple[Body, ...] = (("json", 5000), ("arrow", 5000))


@dataclass(frozen=True)
class Sizes:
    duration_s: float
    warmup_s: float
    rounds: int
    bodies: tuple[Body, ...]


SIZES = {
    "full": Sizes(10, 3, 2, (("json", 1000), ("ndjson", 1000), ("json", 5000), ("arrow", 5000), ("ndjson", 5000),
                             ("json-keyed", 1000), ("ndjson-keyed", 5000), ("arrow-keyed", 5000))),
    "quick": Sizes(2, 1, 1, (("json", 1000), ("ndjson", 5000), ("ndjson-keyed", 5000), ("json", 5000),
                             ("arrow", 5000))),
    "tiny": Sizes(1, 0.5, 1, (("ndjson", 100), ("arrow", 100))),
}


def phases(bodies: tuple[Body, ...]) -> list[list[Body]]:
    """The bodies in the order measured: each alone, but those of TOGETHER in one phase, at the first's place."""
    together = [b for b in bodies if b in TOGETHER]
    out: list[list[Body]] = []
    for body in bodies:
        if body not in together:
            out.append([body])
        elif body == together[0]:
            out.append(together)
    return out


def batch_body(fmt: str, size: int) -> tuple[bytes, str]:
    """`json`, `ndjson` or `arrow` (an Arrow IPC stream of a string value column), keyless; with
    `-keyed`, each message keyed by one of 1,000 user ids."""
    kind, _, keyed = fmt.partition("-")
    if kind == "arrow":
        columns = {"value": pa.array([VALUE_100] * size, pa.string())}
        if keyed:
            columns["key"] = pa.array([f"user-{i % 1000}" for i in range(size)], pa.string())
        table = pa.table(columns)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes(), ARROW_STREAM
    messages = [{"key": f"user-{i % 1000}", "value": VALUE_100} if keyed else {"value": VALUE_100}
                for i in range(size)]
    if kind == "json":
        return orjson.dumps({"messages": messages}), "application/json"
    return b"\n".join(orjson.dumps(m) for m in messages) + b"\n", "application/x-ndjson"


def server_flush(m: dict[str, float]) -> dict[str, float]:
    """The WAL's and the flusher's totals inside a server, from /metrics after a load."""
    rows = m.get("lakebroker_flush_batch_records_sum", 0.0)
    commits = m.get("lakebroker_flush_batch_records_count", 0.0)
    seconds = m.get("lakebroker_flush_latency_seconds_sum", 0.0)
    groups = m.get("lakebroker_wal_group_commit_records_count", 0.0)
    grouped = m.get("lakebroker_wal_group_commit_records_sum", 0.0)
    return {
        "rows": rows, "commits": commits, "rows_per_commit_second": rows / seconds if seconds else 0.0,
        "mean_batch": rows / commits if commits else 0.0, "mean_commit_ms": seconds / commits * 1e3 if commits else 0.0,
        "wal_groups": groups, "mean_wal_group": grouped / groups if groups else 0.0,
    }


def run(mode: Mode, work: Path) -> Result:
    sz = SIZES[mode]
    rows: list[tuple[str, int, int, Measured, Measured]] = []
    with baseline_server(work, "bare") as base, lakebroker_server(work / "batch-data", env=NO_JOBS) as broker:
        create_topic(broker.url, "bench")
        body, ctype = batch_body("json", 1000)
        for server in (base, broker):
            measure(server, BATCH_PATH, work, "batch-warmup", body, ctype, CONNECTIONS, sz.warmup_s)
        for phase in phases(sz.bodies):
            targets = []
            for fmt, size in phase:
                body, ctype = batch_body(fmt, size)
                # Each body into a topic of its own: a Delta commit costs more as its table gathers files, so
                # one shared topic made every body pay for those the bodies before it left (the last most).
                topic = f"bench-{fmt}-{size}"
                create_topic(broker.url, topic)
                path = f"/v1/topics/{topic}/batch"
                accept = ARROW_STREAM if fmt.startswith("arrow") else None
                targets += [Target(server, path, f"batch-{fmt}-{size}-{i}", body, ctype, accept)
                            for i, server in enumerate((base, broker))]
            got = interleave(sz.rounds, sz.duration_s, targets, work, CONNECTIONS)
            for k, (fmt, size) in enumerate(phase):
                rows.append((fmt, size, len(targets[2 * k].body), got[2 * k], got[2 * k + 1]))
        deadline = time.monotonic() + 30  # let the flusher catch up before reading its totals
        while time.monotonic() < deadline and metrics(broker.url).get("lakebroker_wal_backlog_bytes", 0) > 0:
            time.sleep(0.2)
        inside = server_flush(metrics(broker.url))
        peak = broker.peak_rss_mb()
    checks = []
    for keyed, target in ((False, TARGET_MSG_S), (True, TARGET_KEYED_MSG_S)):
        mine = [r for r in rows if r[0].endswith("-keyed") == keyed and not r[0].startswith("arrow")]
        if mine:
            fmt, size, _, b, lb = max(mine, key=lambda r: r[4].ok_rps * r[1])
            checks.append(Check(f"{'keyed (murmur2)' if keyed else 'keyless'} msg/s", lb.ok_rps * size, "msg/s",
                                target, baseline=f"{fmt.upper()} x {size}: {lb.ok_rps / b.rps if b.rps else 0:.2f}x "
                                                 f"bare ASGI req/s with the same body"))
    checks += _arrow_checks(rows)
    if peak is not None:
        checks.append(Check("serve's peak RSS", peak, "MB", TARGET_RSS_MB, higher_is_better=False))
    return Result(
        scenario="batch_produce", checks=checks,
        headlines=[f"{c.name}: {c.shown(c.value)}" for c in checks if c.unit == "msg/s"],
        tables=[table("", ["body", "size", "baseline req/s", "lakebroker req/s", "lakebroker msg/s",
                           "ratio (req/s)", "p50 ms", "p99 ms", "server CPU µs/msg", "server cores", "errors"],
                      [[f"{fmt.upper()} x {size}", f"{nbytes / 1024:,.0f} KiB", f"{b.rps:,.0f}", f"{lb.ok_rps:,.2f}",
                        f"{lb.ok_rps * size:,.0f}", f"{lb.ok_rps / b.rps if b.rps else 0:.2f}", f"{lb.p50_ms:.0f}",
                        f"{lb.p99_ms:.0f}", f"{lb.cpu_us_per_request / size:,.1f}", f"{lb.cpu_share:.2f}", lb.errors]
                       for fmt, size, nbytes, b, lb in rows])],
        notes=[f"Inside the server over this load (from /metrics): {inside['wal_groups']:,.0f} WAL group commits of "
               f"{inside['mean_wal_group']:,.0f} records on average; {inside['commits']:,.0f} Delta commits of "
               f"{inside['mean_batch']:,.0f} rows on average taking {inside['mean_commit_ms']:,.0f} ms each "
               f"(`lakebroker_flush_latency_seconds`), i.e. {inside['rows_per_commit_second']:,.0f} rows per second "
               "of commit time."],
        figures={"rows": [{"body": f"{fmt}-{size}", "msg_s": lb.ok_rps * size, "baseline_rps": b.rps,
                           "errors": lb.errors} for fmt, size, _, b, lb in rows],
                 "server": inside, "peak_rss_mb": peak},
    )


def _arrow_checks(rows: list[tuple[str, int, int, Measured, Measured]]) -> list[Check]:
    by = {(fmt, size): lb.ok_rps * size for fmt, size, _, _, lb in rows}
    checks = []
    arrow, json = by.get(("arrow", 5000)), by.get(("json", 5000))
    if arrow is not None:
        same_run = f"JSON x 5000 {json:,.0f} msg/s" if json is not None else ""
        checks.append(Check("Arrow IPC x 5000, keyless msg/s", arrow, "msg/s", TARGET_ARROW_MSG_S, baseline=same_run))
        if json:
            checks.append(Check("Arrow IPC x 5000 over JSON x 5000, keyless", arrow / json, "x",
                                TARGET_ARROW_OVER_JSON, baseline=same_run))
    keyed = by.get(("arrow-keyed", 5000))
    if keyed is not None:
        checks.append(Check("Arrow IPC x 5000, keyed (murmur2) msg/s", keyed, "msg/s", TARGET_ARROW_KEYED_MSG_S))
    return checks


SCENARIO = Scenario(
    name="batch_produce", title="Batch produce", measure=run,
    setup="`lakebroker serve` at its defaults on 127.0.0.1, scheduled jobs off; each body produced to a topic of "
          "its own (3 partitions, created for it), so no body's rate depends on the table files an earlier body "
          "left; beside it a bare ASGI app that receives the same bodies.",
    load=f"wrk `-t1`, {CONNECTIONS} connections, closed loop, `POST /v1/topics/<topic>/batch` (ack=wal) with bodies "
         "of 1,000 and 5,000 messages `{\"value\": \"<100 characters>\"}`, JSON and NDJSON, keyless or keyed by one of "
         "1,000 user ids (Kafka's murmur2 partitioner); and the same 5,000 messages as an Arrow IPC stream "
         f"(`content-type: {ARROW_STREAM}`, a string `value` column and a `key` column when keyed), answered as "
         "Arrow (`accept` the same); 10 s per body, the baseline and lakebroker alternating. JSON x 5000 and "
         "Arrow x 5000, whose ratio is a target, are measured in one phase: each round loads the four "
         "(bare app and lakebroker, each body) one after another, in reverse order the next round, so both "
         "bodies meet the host at the same speed.",
    metric="Acknowledged messages per second of the fastest keyless and keyed body; server CPU per message; "
           "serve's peak RSS.",
    target=f"≥ {TARGET_MSG_S:,} msg/s keyless, ≥ {TARGET_KEYED_MSG_S:,} msg/s keyed (JSON, NDJSON); Arrow: ≥ "
           f"{TARGET_ARROW_MSG_S:,} msg/s keyless and ≥ {TARGET_ARROW_OVER_JSON:.0f}x JSON x 5000 in the same run, "
           f"≥ {TARGET_ARROW_KEYED_MSG_S:,} msg/s keyed; serve's peak RSS ≤ {TARGET_RSS_MB} MB.",
)
