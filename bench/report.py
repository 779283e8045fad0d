"""Renders one run's results as the markdown of docs/benchmarks.md."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bench.flush import FlushRow, server_flush
from bench.ingest import BatchResult, Measured, SingleResult, VisibilityRun, percentile
from bench.machine import Machine
from bench.plan import (
    CHECK_CONNECTIONS,
    TARGET_BATCH_MSG_S,
    TARGET_FLUSH_ROWS_S,
    TARGET_INGEST_RSS_MB,
    TARGET_KEYED_BATCH_MSG_S,
    TARGET_SINGLE_RATIO,
    TARGET_VISIBLE_P99_S,
    Plan,
)
from bench.profile import FRAMEWORK, HTTP, IDLE, LAKEBROKER, Scenario
from bench.wrk import _LUA


@dataclass
class Results:
    plan: Plan
    machine: Machine
    single: SingleResult | None = None
    batch: BatchResult | None = None
    flush: list[FlushRow] | None = None
    visibility: list[VisibilityRun] | None = None
    profiles: list[Scenario] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    fragments: list[tuple[str, str]] = field(default_factory=list)  # (title, markdown)
    notes: str = ""
    images: dict[str, str] = field(default_factory=dict)  # key → path relative to the markdown
    work_label: str = "$WORK"
    elapsed_s: float = 0.0
    generated: str = ""
    command: str = ""


def n(x: float) -> str:
    return f"{x:,.0f}"


def r2(x: float) -> str:
    return f"{x:.2f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _status(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _scenario(results: Results, prefix: str) -> Scenario | None:
    return next((s for s in results.profiles if s.name.startswith(prefix)), None)


def _share(s: Scenario, *names: str) -> float:
    return sum(v for k, v in s.by_package if k in names)


# -- summary --------------------------------------------------------------------------------------
def _single_limit(results: Results) -> str:
    single = results.single
    assert single is not None
    parts = []
    floor = next((m for label, m in single.decomposition if label.startswith("FastAPI route, async")), None)
    none = next((m for label, m in single.decomposition if "ack=none" in label), None)
    base = next(m for label, m in single.decomposition if label.startswith("bare ASGI (baseline)"))
    ref = next((m for label, m in single.decomposition if label.startswith("reference")), None)
    if ref is not None and base.rps:
        parts.append(f"under h11 the bare baseline itself does {n(base.rps)} req/s at {base.cpu_us_per_request:,.0f} "
                     f"µs of CPU per request; under httptools {n(ref.rps)} req/s at {ref.cpu_us_per_request:,.0f} µs")
    if floor is not None and base.rps:
        parts.append(f"a FastAPI route with produce's signature and no broker work reaches only "
                     f"{r2(floor.rps / base.rps)}x the baseline")
    if none is not None and base.rps:
        parts.append(f"ack=none reaches {r2(none.ok_rps / base.rps)}x, so the WAL fsync is not the limit")
    s = _scenario(results, "single")
    if s is not None:
        parts.append(f"the event-loop thread uses {r2(s.main_cpu_s / s.wall_s)} cores of 1; of its CPU "
                     f"{pct(_share(s, *FRAMEWORK))} is FastAPI/Starlette/anyio, {pct(_share(s, HTTP, IDLE))} "
                     f"HTTP protocol and C, {pct(_share(s, *LAKEBROKER))} lakebroker code")
    return "; ".join(parts) or "see section 1"


def _batch_limit(results: Results) -> str:
    s = _scenario(results, "batch")
    if s is None:
        return "see section 2"
    return (f"the event-loop thread uses {r2(s.main_cpu_s / s.wall_s)} cores of 1; "
            f"{pct(_share(s, *LAKEBROKER))} of its CPU is lakebroker per-message "
            f"Python (see the profile); other threads use {r2(s.other_cpu_s / s.wall_s)} cores (WAL encode and "
            f"fsync, the flusher)")


def _flush_limit(rows: list[FlushRow]) -> str:
    big = max(rows, key=lambda r: r.records)
    return (f"at {n(big.records)} rows per commit the flusher reaches {r2(big.ratio)}x a bare delta-rs append of "
            f"the same rows ({n(big.floor_rows_s)} rows/s); its Arrow assembly alone runs at "
            f"{n(big.to_arrow_rows_s)} rows/s, so the rest is delta-rs's write on this machine")


def _visibility_limit(run: VisibilityRun) -> str:
    first, last = run.trend()
    ack50, ack99 = percentile(run.ack_s, 0.5), percentile(run.ack_s, 0.99)
    flush50, flush99 = percentile(run.after_ack_s, 0.5), percentile(run.after_ack_s, 0.99)
    parts = []
    if last > 1.5 * first and last - first > 0.2:
        parts.append(f"the median grew from {ms(first)} to {ms(last)} during the run (a growing backlog)")
    if ack99 > TARGET_VISIBLE_P99_S / 2:
        parts.append(f"the probe's own produce requests wait (ack p50 {ms(ack50)}, p99 {ms(ack99)}): the server "
                     "accepts fewer single messages than the probe sends while the batch producer takes the event "
                     "loop, so they queue")
    if flush99 > TARGET_VISIBLE_P99_S / 2:
        parts.append(f"after the ack, rows wait for a commit (ack→visible p50 {ms(flush50)}, p99 {ms(flush99)})")
    if run.not_visible:
        parts.append(f"{run.not_visible} acked messages were not yet visible when the watch ended")
    if run.background is not None:
        parts.append(f"a batch producer ran alongside at {n(run.flood_msg_s)} msg/s")
    return "; ".join(parts)


def _memory_row(results: Results) -> list[str] | None:
    """Serve's peak resident memory (the kernel's VmHWM, its delivery process not included) in each
    benchmark's server, against the issue's bound for all of them."""
    peaks = []
    if results.single is not None and results.single.peak_rss_mb is not None:
        peaks.append(("single produce", results.single.peak_rss_mb))
    if results.batch is not None and results.batch.peak_rss_mb is not None:
        peaks.append(("batch produce", results.batch.peak_rss_mb))
    runs = [r for r in results.visibility or [] if r.peak_rss_mb is not None]
    if runs:
        peaks.append(("produce→visible with its flood", max(r.peak_rss_mb or 0.0 for r in runs)))
    peaks += _dedup_peaks(results)
    if not peaks:
        return None
    ok = all(mb <= TARGET_INGEST_RSS_MB for _, mb in peaks)
    return ["7. ingest memory: serve's peak RSS", "; ".join(f"{label} {mb:,.0f} MB" for label, mb in peaks),
            "n/a (a size)", f"≤ {TARGET_INGEST_RSS_MB} MB in each", _status(ok),
            "" if ok else "about 120 MB are mapped library pages; delta-rs's jemalloc keeps some native memory "
            "from each flush commit, and the batch path's Arrow buffers and large flush commits add transient "
            "peaks (docs/operations.md, \"Memory\")"]


def _dedup_peaks(results: Results) -> list[tuple[str, float]]:
    """serve's peaks with a full dedup index and after its restart's rebuild (bench.dedup_memory),
    when that module ran in this run (a fragment from an earlier run starts with its date)."""
    for title, fragment in results.fragments:
        found = re.search(r"<!-- serve-peak-rss-mb: full-index=([\d.]+) restart=([\d.]+) -->", fragment)
        if title == "Dedup index" and found and not fragment.startswith("_"):
            return [("a full dedup index", float(found[1])), ("its restart's rebuild", float(found[2]))]
    return []


def summary(results: Results) -> str:
    rows = []
    if results.single is not None:
        at = results.single.checked()
        met = at.ratio >= TARGET_SINGLE_RATIO
        rows.append([
            "1. single-message produce, ack=wal", f"{n(at.broker.ok_rps)} msg/s at {at.connections} connections "
            f"({at.broker.cpu_us_per_request:,.0f} µs of server CPU per message)",
            f"{r2(at.ratio)}x bare ASGI ({n(at.baseline.rps)} req/s)",
            f"≥ {TARGET_SINGLE_RATIO:g}x bare ASGI at {at.connections} connections", _status(met),
            "" if met else _single_limit(results),
        ])
    for keyed, label, target in ((False, "2. batch produce, 100-byte values", TARGET_BATCH_MSG_S),
                                 (True, "2. batch produce, keyed (murmur2)", TARGET_KEYED_BATCH_MSG_S)):
        best_b = results.batch.best(keyed) if results.batch is not None else None
        if best_b is None:
            continue
        rows.append([
            label, f"{n(best_b.msg_s)} msg/s ({best_b.size}-message "
            f"{best_b.fmt.upper()} bodies; {best_b.broker.cpu_us_per_request / best_b.size:,.1f} µs of server CPU "
            "per message)", f"{r2(best_b.ratio)}x bare ASGI req/s with the same body",
            f"≥ {n(target)} msg/s", _status(best_b.msg_s >= target),
            "" if best_b.msg_s >= target else _batch_limit(results),
        ])
    if results.flush:
        best_f = max(results.flush, key=lambda r: r.flush_rows_s)
        inside = server_flush(results.batch.server_metrics) if results.batch else None
        measured = f"{n(best_f.flush_rows_s)} rows/s in-process ({n(best_f.records)} rows per commit)"
        if inside and inside["rows"]:
            measured += f"; {n(inside['rows_per_commit_second'])} rows/s of commit time inside the server"
        rows.append([
            "3. WAL→Delta flush", measured, f"{r2(best_f.ratio)}x bare delta-rs append", f"≥ {n(TARGET_FLUSH_ROWS_S)} "
            "rows/s", _status(best_f.flush_rows_s >= TARGET_FLUSH_ROWS_S),
            "" if best_f.flush_rows_s >= TARGET_FLUSH_ROWS_S else _flush_limit(results.flush),
        ])
    idle = next((r for r in results.visibility or [] if r.background is None), None)
    for run in results.visibility or []:
        p99 = percentile(run.visible_s, 0.99)
        ok = bool(run.visible_s) and p99 <= TARGET_VISIBLE_P99_S and run.not_visible == 0
        measured = f"p50 {ms(percentile(run.visible_s, 0.5))}, p99 {ms(p99)}"
        against = "n/a (a latency)"
        if run.background is not None:
            measured += (f" beside a flood of {n(run.flood_msg_s)} msg/s ({run.cpu_us_per_message:.1f} µs of server "
                         "CPU per message)")
            if idle is not None:
                against = (f"the same probe on the idle server: p50 {ms(percentile(idle.visible_s, 0.5))}, "
                           f"p99 {ms(percentile(idle.visible_s, 0.99))}")
        rows.append([
            f"4. produce→visible in Delta, {run.label}", measured,
            against, f"p99 ≤ {TARGET_VISIBLE_P99_S:g} s", _status(ok),
            "" if ok else _visibility_limit(run),
        ])
    memory = _memory_row(results)
    if memory is not None:
        rows.append(memory)
    return _table(["benchmark", "measured", "ratio to same-run baseline", "target", "status", "what limits it"], rows)


# -- sections --------------------------------------------------------------------------------------
def machine_section(m: Machine, results: Results) -> str:
    pkgs = ", ".join(f"{k} {v}" for k, v in m.packages.items())
    return f"""## Machine

- nproc: {m.nproc}; kernel {m.kernel}
- Python {m.python}; {m.java}; {m.wrk}
- packages: {pkgs}
- code: commit `{m.commit}` with {m.dirty_files} uncommitted paths in the working tree
- load average (1, 5, 15 min) at start: {m.loadavg_start}; at end: {m.loadavg_now()} (other engineers share this
  machine, which is why every figure sits beside a baseline measured in the same run)

```
$ lscpu   # selected lines
{m.lscpu}

$ free -m
{m.free}
```
"""


def method_section(results: Results) -> str:
    p = results.plan
    single = results.single
    commands = []
    if single is not None and single.points:
        commands.append(single.points[0].broker.command)
    if results.batch is not None and results.batch.rows:
        commands.append(results.batch.rows[0].broker.command)
    for run in results.visibility or []:
        commands.extend(run.commands[:2])
        if run.background is not None:
            commands.append(run.background.command)
        break
    shown = "\n".join(c.replace(results.work_label, "$WORK") for c in commands if c)
    lua = _LUA.format(body="$WORK/<name>.body", content_type="application/json")
    return f"""## How it was measured

`{results.command}` ran every benchmark below ({p.name} mode: {p.duration_s:g} s per measurement,
{p.rounds} round(s) per point with the baseline and lakebroker alternating A-B/B-A, {p.warmup_s:g} s warm-up
per server). It took {results.elapsed_s:.0f} s.

- Servers: the baseline (`python -m bench.baseline_app`, a bare ASGI app answering a fixed 45-byte JSON after
  reading the body) and the FastAPI floor (`--app fastapi`) run under the same uvicorn settings as
  `lakebroker serve`, imported from lakebroker/server.py (tests/bench pins that they agree): {_protocol()}.
  Each benchmark gets a fresh `python -m lakebroker --data-dir $WORK/<x> serve --port 0` with default
  settings (WAL fsync on, flush every 100 ms); the harness reads its URL from data_dir/server.json, as
  tests/servers.py does. Everything binds 127.0.0.1.
- Load: wrk (`-t1`, one load thread, so the server keeps the other core) for closed loops; bench.loadgen (its
  own process, raw-socket asyncio HTTP/1.1 keep-alive) for the open-loop latency probe. Every run is bounded
  by duration and by a process timeout; loadgen also by request count.
- "Server CPU" is the user+system time of the server process over the measurement (/proc/PID/stat), so
  µs/request is a figure that a busy neighbour disturbs far less than requests/s.
- Ratios compare lakebroker's successful (2xx) requests/s with the baseline's requests/s at the same
  connection count and body.

Commands as run (one of each kind; ports are whatever was free):

```
{shown}
```

The wrk Lua script (`bench/wrk.py`):

```lua
{lua.strip()}
```
"""


def _protocol() -> str:
    from bench.baseline_app import uvicorn_settings

    settings = uvicorn_settings()
    http = settings.get("http", "auto")
    name = http if isinstance(http, str) else f"{http.__module__}.{http.__name__}"
    return (f"http={name}, loop={settings.get('loop', 'auto')} (uvloop when installed), access log "
            f"{'on' if settings.get('access_log', True) else 'off'}, limit_concurrency "
            f"{settings.get('limit_concurrency')}")


def _m_row(label: str, m: Measured, base: Measured, msg_per_req: int = 1) -> list[str]:
    ratio = m.ok_rps / base.rps if base.rps else 0.0
    return [label, n(m.ok_rps * msg_per_req), n(m.rps), r2(ratio), f"{m.p50_ms:.1f}", f"{m.p99_ms:.1f}",
            f"{m.cpu_us_per_request:,.0f}", r2(m.cpu_share), str(m.errors)]


def single_section(results: Results) -> str:
    single = results.single
    assert single is not None
    rows = []
    for p in single.points:
        rows.append([str(p.connections), n(p.baseline.rps), f"{p.baseline.cpu_us_per_request:,.0f}",
                     n(p.broker.ok_rps), r2(p.ratio), f"{p.broker.p50_ms:.1f}", f"{p.broker.p99_ms:.1f}",
                     f"{p.broker.cpu_us_per_request:,.0f}", r2(p.broker.cpu_share), str(p.broker.errors)])
    sweep = _table(["connections", "baseline req/s", "baseline CPU µs/req", "lakebroker msg/s", "ratio",
                    "p50 ms", "p99 ms", "lakebroker CPU µs/msg", "server cores", "errors"], rows)
    base = next(m for label, m in single.decomposition if label.startswith("bare ASGI (baseline)"))
    decomposition = _table(
        ["server", "msg/s", "req/s", "ratio to baseline", "p50 ms", "p99 ms", "server CPU µs/req", "server cores",
         "errors"],
        [_m_row(label, m, base) for label, m in single.decomposition],
    )
    img = results.images.get("throughput", "")
    c = results.plan.decomposition_connections
    return f"""## 1. Single-message produce (ack=wal)

`POST /v1/topics/bench/messages` with a {len(_single_body())}-byte JSON body (`application/json`), keyless,
3 partitions, ack=wal (answered after the WAL group commit's fdatasync), against `serve` at its defaults
but for its scheduled Spark jobs, which are off in every HTTP benchmark here (a job's JVM would share the
cores with the load). Target (issue 11): ≥ {TARGET_SINGLE_RATIO:g}x the bare ASGI app in the same run, judged
at {CHECK_CONNECTIONS} connections (the issue checks with `wrk -t1 -c{CHECK_CONNECTIONS}`;
`python -m bench.wire_ab` runs that check with the issue's own body).

{sweep}

![throughput against concurrency]({img})

Where the time goes, at {c} connections: the same request against servers that do less and less of the work.

{decomposition}
"""


def _single_body() -> bytes:
    from bench.ingest import SINGLE_BODY

    return SINGLE_BODY


def batch_section(results: Results) -> str:
    batch = results.batch
    assert batch is not None
    rows = []
    for r in batch.rows:
        rows.append([f"{r.fmt.upper()} x {r.size}", f"{r.body_bytes / 1024:,.0f} KiB", n(r.baseline.rps),
                     r2(r.broker.ok_rps), n(r.msg_s), r2(r.ratio), f"{r.broker.p50_ms:.0f}",
                     f"{r.broker.p99_ms:.0f}", f"{r.broker.cpu_us_per_request / r.size:,.1f}",
                     r2(r.broker.cpu_share), str(r.broker.errors)])
    table = _table(["body", "size", "baseline req/s", "lakebroker req/s", "lakebroker msg/s", "ratio (req/s)",
                    "p50 ms", "p99 ms", "server CPU µs/msg", "server cores", "errors"], rows)
    f = server_flush(batch.server_metrics)
    return f"""## 2. Batch produce (100-byte values)

`POST /v1/topics/bench/batch` (ack=wal) with {results.plan.batch_connections} connections; each message is
`{{"value": "<100 characters>"}}`, keyless, or with `-KEYED` `{{"key": "user-<i mod 1000>", "value": ...}}`
(Kafka murmur2 partitions). Both take the columnar path (`ingest_api/columnar.py`). The baseline receives the
same bodies. Targets: ≥ {n(TARGET_BATCH_MSG_S)} msg/s keyless, ≥ {n(TARGET_KEYED_BATCH_MSG_S)} msg/s keyed.

{table}

Inside the server over this load ({batch.load_wall_s:.0f} s, from /metrics): {n(f['wal_groups'])} WAL group commits of
{f['mean_wal_group']:,.0f} records on average; {n(f['commits'])} Delta commits of {f['mean_batch']:,.0f} rows on
average taking {f['mean_commit_ms']:,.0f} ms each (`lakebroker_flush_latency_seconds`), i.e.
{n(f['rows_per_commit_second'])} rows per second of commit time.
"""


def flush_section(results: Results) -> str:
    rows = [[n(r.records), n(r.flush_rows_s), f"{r.flush_ms:,.1f}", n(r.to_arrow_rows_s), n(r.floor_rows_s),
             r2(r.ratio)] for r in results.flush or []]
    table = _table(["rows per commit", "flusher rows/s", "ms per commit", "Arrow assembly alone rows/s",
                    "bare delta-rs append rows/s (floor)", "ratio to floor"], rows)
    return f"""## 3. WAL→Delta flush

In-process (bench/flush.py): batches as the columnar produce path leaves them (1,000-message keyless batches
of 100-byte values over 3 partitions: a chunk of ~333 messages per partition and batch, offsets dense) go
through `Flusher.add` and `Flusher.flush_once`, the server's own commit path (txn check, chunks sliced and
concatenated into one Arrow table by `chunks_to_arrow`, delta-rs append with per-partition txn actions, in
`asyncio.to_thread`). The floor is a
bare `write_deltalake` append of the same rows already in Arrow form, timed in the same run. Median of
{results.plan.flush_repeats} repeat(s). Target: ≥ {n(TARGET_FLUSH_ROWS_S)} rows/s.

{table}
"""


def visibility_headlines(results: Results) -> list[str]:
    """Section 4's figures in one line per scenario, for stdout: the fairness figure beside its baseline."""
    lines = []
    for run in results.visibility or []:
        flood = f" beside a flood of {n(run.flood_msg_s)} msg/s" if run.background is not None else ""
        lines.append(f"4. produce→visible, {run.label}: p50 {ms(percentile(run.visible_s, 0.5))}, "
                     f"p99 {ms(percentile(run.visible_s, 0.99))}{flood} (target p99 ≤ {TARGET_VISIBLE_P99_S:g} s)")
    return lines


def visibility_section(results: Results) -> str:
    rows = []
    for run in results.visibility or []:
        v, a = run.visible_s, run.ack_s
        bg = (f"; flood {n(run.flood_msg_s)} msg/s" if run.background else "")
        first, last = run.trend()
        aa = run.after_ack_s
        rows.append([run.label + bg, f"{run.rate:.0f}", f"{run.acked}/{run.sent}",
                     ms(percentile(a, 0.5)), ms(percentile(a, 0.99)), ms(percentile(run.sent_to_ack_s, 0.99)),
                     ms(percentile(aa, 0.5)), ms(percentile(aa, 0.99)),
                     ms(percentile(v, 0.5)), ms(percentile(v, 0.9)), ms(percentile(v, 0.99)), ms(max(v) if v else 0.0),
                     f"{ms(first)} → {ms(last)}", str(run.not_visible), str(run.commits), run.rows_check,
                     f"{run.cpu_us_per_message:.1f} µs"])
    table = _table(["scenario", "probe msg/s", "acked/sent", "ack p50", "ack p99", "sent→ack p99", "ack→visible p50",
                    "ack→visible p99", "visible p50", "visible p90", "visible p99", "visible max",
                    "visible p50, first → last fifth", "never visible", "snapshots with new rows", "row check",
                    "server CPU per message"], rows)
    img = results.images.get("cdf", "")
    return f"""## 4. Produce → visible in Delta

A producer (bench.loadgen, open loop, 8 connections) sends single messages with ack=wal at a steady rate and
records when each was due, when it was acknowledged, and the partition and offset of its answer. A watcher
(bench.poller, its own process) refreshes a delta-rs snapshot of the topic table every 10 ms and records
when each partition's committed log-end (the txn action the flusher writes in the same commit as the rows)
passes each offset. The
latency ("visible") is due time → first snapshot showing the offset, so it includes up to 10 ms of polling
granularity; "ack→visible" starts at the acknowledgement instead, and so isolates the WAL→Delta path.
At the end the watcher reads the rows themselves and checks they are present and dense. A median that grows
from the first fifth of the run to the last means a backlog is growing: in the produce path if the ack
latency grows, in the flush path if ack→visible does. Either way the latency then has no bound but the
backlog limit. Target: p99 ≤ {TARGET_VISIBLE_P99_S:g} s.

Fairness: the same probe runs twice on one server, first alone (the idle row, its same-run baseline), then
beside a flood of 1,000-message JSON batches from wrk (`-t1`, {results.plan.flood_connections} connections,
closed loop, its own process) to another topic on the same server. The flood's msg/s is what the server
accepted while the probe ran; server CPU per message counts the probe's and the flood's messages.

{table}

![produce to table CDF]({img})
"""


def _unprofiled(results: Results, s: Scenario) -> str:
    if s.name.startswith("single") and results.single is not None:
        at = next((p for p in results.single.points if p.connections == results.plan.decomposition_connections), None)
        if at is not None:
            return f" (unprofiled, section 1: {n(at.broker.ok_rps)} req/s)"
    if s.name.startswith("batch") and results.batch is not None and results.batch.rows:
        return f" (unprofiled, section 2: {n(results.batch.rows[0].broker.ok_rps)} req/s)"
    return ""


def profile_section(results: Results) -> str:
    out = ["""## Profiles of the server under load

The server ran under `bench.sampler` (SIGPROF every 2 ms of process CPU; each thread's stack weighted by the CPU
it used since its previous sample, so idle time weighs nothing). "Self" is the innermost Python frame, which
also carries the C code it called; "total" counts a function once per sample anywhere on the stack. Sampling
costs throughput: compare the profiled rate with the unprofiled one in sections 1 and 2.
"""]
    for s in results.profiles:
        pkg = _table(["package of the innermost frame", "share of event-loop CPU"],
                     [[k, pct(v)] for k, v in s.by_package[:10]])
        selfs = _table(["function (self)", "share"], [[f"`{k}`", pct(v)] for k, v in s.main_self])
        totals = _table(["function (total)", "share"], [[f"`{k}`", pct(v)] for k, v in s.main_total])
        chain = ", ".join(f"`{k.split('(')[-1].rstrip(')')}` ({k.split(':')[0]}) {pct(v)}" for k, v in s.chain)
        workers = _table(["function (self)", "share of busy worker CPU"],
                         [[f"`{k}`", pct(v)] for k, v in s.worker_self[:8]])
        unprofiled = _unprofiled(results, s)
        out.append(f"""### {s.name}

{n(s.load.ok_rps)} req/s while profiled{unprofiled}, over {s.wall_s:.1f} s.
Event-loop thread: {r2(s.main_cpu_s / s.wall_s)} cores; all other threads: {r2(s.other_cpu_s / s.wall_s)} cores
(from /proc/PID/task). {s.samples:,} samples.

{pkg}

Event-loop thread, innermost frames:

{selfs}

Event-loop thread, inclusive. Left out: the frames on (nearly) every stack, and the ASGI middleware chain
each request passes through, on at least half the samples: {chain or "none"}.

{totals}

Other threads (WAL writes, Delta commits), busy CPU only:

{workers}
""")
    return "\n".join(out)


def render(results: Results) -> str:
    parts = [f"""# lakebroker ingest benchmarks

Generated by `{results.command}` ({results.plan.name} mode) at {results.generated}. Every figure is measured on
loopback on a shared 2-core machine and quoted beside a baseline measured in the same run: the same load
against a bare ASGI app under the same uvicorn settings (for HTTP), or a bare delta-rs append (for the flush).
Compare ratios across runs, not absolute rates.

## Summary

{summary(results)}
"""]
    if results.errors:
        parts.append("**Benchmarks that failed in this run:**\n\n" + "\n".join(f"- {e}" for e in results.errors) + "\n")
    if results.single is not None:
        parts.append(single_section(results))
    if results.batch is not None:
        parts.append(batch_section(results))
    if results.flush is not None:
        parts.append(flush_section(results))
    if results.visibility is not None:
        parts.append(visibility_section(results))
    if results.profiles:
        parts.append(profile_section(results))
    if results.notes:
        parts.append(results.notes.strip() + "\n")
    parts.append(method_section(results))
    parts.append(machine_section(results.machine, results))
    for title, fragment in results.fragments:
        parts.append(f"## {title}\n\n{fragment.strip()}\n")
    return "\n".join(parts)


def relative(path: Path, to: Path) -> str:
    try:
        return str(path.relative_to(to))
    except ValueError:
        return str(path)
