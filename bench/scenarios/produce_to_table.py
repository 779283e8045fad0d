"""Produce → visible in Delta: how long a single message acknowledged at ack=wal takes to show in the topic's
table, on an idle server and beside a flood of batches to another topic on the same server (fairness)."""

from __future__ import annotations

import bisect
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.harness import plots
from bench.harness.compare import percentile
from bench.harness.servers import NO_JOBS, REPO, BenchError, Server, create_topic, lakebroker_server, metrics
from bench.harness.wrk import LoadResult, finish_wrk, start_wrk, write_script
from bench.result import Check, Image, Mode, Result, Scenario, table
from bench.scenarios.batch_produce import batch_body
from lakebroker.tables.layout import Layout

TARGET_P99_S = 1.0
TARGET_RSS_MB = 300


@dataclass(frozen=True)
class Flood:
    """A saturating batch producer beside the probe: wrk's closed loop of one body to another topic."""

    fmt: str  # batch_produce.batch_body's
    size: int  # messages per request
    connections: int
    label: str


FLOODS = (
    # 32 closed loops of 1,000-message bodies arrive together: the case that starved single messages (4 did not)
    Flood("json", 1000, 32, "beside a saturating batch producer"),
    Flood("arrow", 5000, 4, "beside a saturating Arrow producer"),
)


@dataclass(frozen=True)
class Sizes:
    rate: float  # messages/s of the probe
    seconds: float
    under_load: bool


SIZES = {"full": Sizes(200, 30, True), "quick": Sizes(200, 5, True), "tiny": Sizes(50, 2, False)}


@dataclass
class VisibilityRun:
    label: str
    rate: float
    sent: int
    acked: int
    visible_s: list[float]  # per acked message, in due order: due time → first snapshot showing it
    ack_s: list[float]
    after_ack_s: list[float]  # ack → first snapshot showing it: the flush path alone
    not_visible: int
    rows_check: str
    polls: int
    commits: int
    background: LoadResult | None = None
    flood: Flood | None = None
    sent_to_ack_s: list[float] = field(default_factory=list)  # from the send, so without the client's queue
    commands: list[str] = field(default_factory=list)
    server_cpu_s: float = 0.0  # the server process over the probe (and flood), user + system
    peak_rss_mb: float | None = None  # serve's, from its start to the end of this run

    @property
    def flood_msg_s(self) -> float:
        if self.background is None or self.flood is None:
            return 0.0
        return self.background.ok_rps * self.flood.size

    @property
    def cpu_us_per_message(self) -> float:
        """Server CPU per message accepted: the probe's and the flood's together."""
        messages = self.acked
        if self.background is not None and self.flood is not None:
            messages += (self.background.requests - self.background.errors) * self.flood.size
        return self.server_cpu_s / messages * 1e6 if messages else 0.0

    def trend(self) -> tuple[float, float]:
        """Median latency of the first and of the last fifth of the run: growth means a backlog."""
        k = max(1, len(self.visible_s) // 5)
        return percentile(self.visible_s[:k], 0.5), percentile(self.visible_s[-k:], 0.5)


def _wait_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise BenchError(f"{path} did not appear in {timeout}s")
        time.sleep(0.05)


def visibility_run(sz: Sizes, broker: Server, topic: str, work: Path, label: str,
                   flood: Flood | None) -> VisibilityRun:
    partitions = 3
    create_topic(broker.url, topic, partitions)
    table = Layout(Path(broker.ready_file).parent).topic_table(topic)
    seen_file, sent_file, ready = work / f"{topic}-seen.json", work / f"{topic}-sent.json", work / f"{topic}.ready"
    grace = 5.0
    poller_argv = [sys.executable, "-m", "bench.harness.poller", "--table", table, "--partitions", str(partitions),
                   "--interval", "0.01", "--duration", str(sz.seconds + grace + 10), "--out", str(seen_file),
                   "--ready-file", str(ready)]
    count = int(sz.rate * sz.seconds)
    template = '{"value": {"seq": {seq}, "probe": "produce-to-table latency"}}'
    loadgen_argv = [sys.executable, "-m", "bench.harness.loadgen", "--url", f"{broker.url}/v1/topics/{topic}/messages",
                    "--body-template", template, "--rate", str(sz.rate), "--connections", "8",
                    "--duration", str(sz.seconds), "--max-requests", str(count), "--record-body",
                    "--out", str(sent_file)]
    poller = subprocess.Popen(poller_argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bg_proc: subprocess.Popen[str] | None = None
    bg_result: LoadResult | None = None
    try:
        _wait_file(ready, 30)
        cpu_before = broker.cpu()
        if flood is not None:
            bg_proc = _start_flood(broker, work, sz.seconds + 1, flood)
        subprocess.run(loadgen_argv, cwd=REPO, check=True, timeout=sz.seconds + 60, capture_output=True)
        if bg_proc is not None and flood is not None:
            bg_result = finish_wrk(bg_proc, sz.seconds + 1, flood.connections)
        cpu_s = broker.cpu() - cpu_before
        # The probe is done; stop watching once every acked offset is visible or the grace ends.
        sent = orjson.loads(sent_file.read_bytes())["samples"]
        need: dict[int, int] = {}
        for s in sent:
            if s[3] == 200 and s[5] is not None:
                need[s[4]] = max(need.get(s[4], -1), s[5])
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            ends = _committed_ends(broker.url, topic, partitions)
            if all(ends.get(p, 0) > o for p, o in need.items()):
                break
            time.sleep(0.05)
        time.sleep(0.1)
        poller.terminate()  # SIGTERM: the poller writes its file and exits
        poller.wait(timeout=60)
    finally:
        if poller.poll() is None:
            poller.kill()
            poller.wait()
        if bg_proc is not None and bg_proc.poll() is None:
            bg_proc.kill()
            bg_proc.wait()
    _wait_file(seen_file, 10)
    seen = orjson.loads(seen_file.read_bytes())
    run = join_visibility(label, sz.rate, sent, seen, partitions)
    run.background, run.flood = bg_result, flood
    run.server_cpu_s = cpu_s
    run.commands = [" ".join(a[1:]).replace(str(REPO) + "/", "").replace(str(work), "$WORK")
                    for a in (loadgen_argv, poller_argv)]
    return run


def _committed_ends(url: str, topic: str, partitions: int) -> dict[int, int]:
    m = metrics(url)
    return {p: int(m.get(f'lakebroker_partition_high_watermark{{partition="{p}",topic="{topic}"}}', 0))
            for p in range(partitions)}


def join_visibility(label: str, rate: float, sent: list[list[Any]], seen: dict[str, Any],
                    partitions: int) -> VisibilityRun:
    times: dict[int, list[float]] = {p: [] for p in range(partitions)}
    ends: dict[int, list[int]] = {p: [] for p in range(partitions)}
    for t, p, end in seen["changes"]:
        times[p].append(t)
        ends[p].append(end)
    visible: list[tuple[float, float]] = []
    acks, after_ack, missing, acked = [], [], 0, 0
    served = []
    for due, sent_at, done, status, p, offset in sent:
        if status != 200 or p is None or offset is None:
            continue
        acked += 1
        acks.append(done - due)
        served.append(done - sent_at)
        i = bisect.bisect_right(ends[p], offset)  # the first snapshot whose log-end is past the offset
        if i < len(ends[p]):
            visible.append((due, times[p][i] - due))
            after_ack.append(times[p][i] - done)
        else:
            missing += 1
    problems = [f"partition {p}: {n} rows for offsets {lo}..{hi}" for p, (n, lo, hi) in seen["present"].items()
                if n and n != hi - lo + 1]
    rows_check = "rows present and dense in every partition" if not problems else "; ".join(problems)
    return VisibilityRun(label, rate, len(sent), acked, [v for _, v in sorted(visible)], acks, after_ack, missing,
                         rows_check, seen["polls"], len(seen["changes"]), sent_to_ack_s=served)


def _start_flood(broker: Server, work: Path, duration_s: float, flood: Flood) -> subprocess.Popen[str]:
    body, ctype = batch_body(flood.fmt, flood.size)
    topic = f"background-{flood.fmt}"
    create_topic(broker.url, topic)
    accept = ctype if flood.fmt.startswith("arrow") else None
    return start_wrk(f"{broker.url}/v1/topics/{topic}/batch", write_script(work, topic, body, ctype, accept=accept),
                     flood.connections, duration_s)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _limit(run: VisibilityRun) -> str:
    """What kept a run over its target, from its own figures."""
    first, last = run.trend()
    ack50, ack99 = percentile(run.ack_s, 0.5), percentile(run.ack_s, 0.99)
    flush50, flush99 = percentile(run.after_ack_s, 0.5), percentile(run.after_ack_s, 0.99)
    parts = []
    if last > 1.5 * first and last - first > 0.2:
        parts.append(f"the median grew from {_ms(first)} to {_ms(last)} during the run (a growing backlog)")
    if ack99 > TARGET_P99_S / 2:
        parts.append(f"the probe's own produce requests waited (ack p50 {_ms(ack50)}, p99 {_ms(ack99)})")
    if flush99 > TARGET_P99_S / 2:
        parts.append(f"after the ack, rows waited for a commit (ack→visible p50 {_ms(flush50)}, p99 {_ms(flush99)})")
    if run.not_visible:
        parts.append(f"{run.not_visible} acked messages were not yet visible when the watch ended")
    return f"{run.label}: " + "; ".join(parts) + "."


def run(mode: Mode, work: Path) -> Result:
    sz = SIZES[mode]
    runs = []
    with lakebroker_server(work / "visibility-data", env=NO_JOBS) as broker:
        runs.append(visibility_run(sz, broker, "latency", work, "idle server", flood=None))
        runs[-1].peak_rss_mb = broker.peak_rss_mb()
        for flood in FLOODS if sz.under_load else ():
            runs.append(visibility_run(sz, broker, f"latency-{flood.fmt}", work, flood.label, flood=flood))
            runs[-1].peak_rss_mb = broker.peak_rss_mb()
    idle = runs[0]
    checks, rows, notes = [], [], []
    for r in runs:
        p99 = percentile(r.visible_s, 0.99)
        base = "" if r is idle else (f"the same probe on the idle server: p50 {_ms(percentile(idle.visible_s, 0.5))}, "
                                      f"p99 {_ms(percentile(idle.visible_s, 0.99))}")
        checks.append(Check(f"visible p99, {r.label}", p99 * 1000, "ms", TARGET_P99_S * 1000, higher_is_better=False,
                            baseline=base))
        checks.append(Check(f"acknowledged but never visible, {r.label}", r.not_visible, "messages", 0,
                            higher_is_better=False))
        if p99 > TARGET_P99_S or r.not_visible:
            notes.append(_limit(r))
        first, last = r.trend()
        beside = f"; flood {r.flood_msg_s:,.0f} msg/s" if r.background else ""
        rows.append([r.label + beside, f"{r.rate:.0f}", f"{r.acked}/{r.sent}", _ms(percentile(r.ack_s, 0.5)),
                     _ms(percentile(r.ack_s, 0.99)), _ms(percentile(r.sent_to_ack_s, 0.99)),
                     _ms(percentile(r.after_ack_s, 0.5)), _ms(percentile(r.after_ack_s, 0.99)),
                     _ms(percentile(r.visible_s, 0.5)), _ms(percentile(r.visible_s, 0.9)), _ms(p99),
                     _ms(max(r.visible_s) if r.visible_s else 0.0), f"{_ms(first)} → {_ms(last)}", r.not_visible,
                     r.commits, r.rows_check, f"{r.cpu_us_per_message:.1f} µs"])
    peak = max((r.peak_rss_mb for r in runs if r.peak_rss_mb is not None), default=None)
    if peak is not None:
        checks.append(Check("serve's peak RSS", peak, "MB", TARGET_RSS_MB, higher_is_better=False))
    result = Result(
        scenario="produce_to_table", checks=checks,
        headlines=[f"{r.label}: p50 {_ms(percentile(r.visible_s, 0.5))}, p99 {_ms(percentile(r.visible_s, 0.99))}"
                   + (f" beside a flood of {r.flood_msg_s:,.0f} msg/s" if r.background else "") for r in runs],
        tables=[table("", ["scenario", "probe msg/s", "acked/sent", "ack p50", "ack p99", "sent→ack p99",
                           "ack→visible p50", "ack→visible p99", "visible p50", "visible p90", "visible p99",
                           "visible max", "visible p50, first → last fifth", "never visible",
                           "snapshots with new rows", "row check", "server CPU per message"], rows)],
        notes=notes,
        figures={"runs": [{"label": r.label, "visible_s": r.visible_s, "acked": r.acked, "sent": r.sent,
                           "not_visible": r.not_visible, "flood_msg_s": r.flood_msg_s, "peak_rss_mb": r.peak_rss_mb}
                          for r in runs], "commands": runs[0].commands},
    )
    if mode == "full":
        plots.visibility_cdf([(f"{r.label} ({r.rate:.0f} msg/s)", r.visible_s) for r in runs], TARGET_P99_S,
                             plots.IMG_DIR / "produce_to_table_cdf.png")
        result.images.append(Image("produce to table CDF", "img/produce_to_table_cdf.png"))
    return result


SCENARIO = Scenario(
    name="produce_to_table", title="Produce → visible in Delta", measure=run,
    setup="`lakebroker serve` at its defaults on 127.0.0.1, scheduled jobs off, topics of 3 partitions. A watcher "
          "in its own process (bench/harness/poller.py) refreshes a delta-rs snapshot of the topic table every "
          "10 ms and records when each partition's committed log end (the txn action the flusher writes with the "
          "rows) passes each offset; at the end it reads the rows and checks they are present and dense.",
    load="An open-loop producer in its own process (bench/harness/loadgen.py, 8 connections) sends single "
         "messages at ack=wal, 200 a second for 30 s, recording when each was due, acknowledged and placed. "
         f"Then the same probe beside a flood: wrk `-t1 -c{FLOODS[0].connections}`, closed loop, "
         f"{FLOODS[0].size:,}-message JSON batches to another topic of the same server; then beside wrk "
         f"`-t1 -c{FLOODS[1].connections}` sending {FLOODS[1].size:,}-message Arrow IPC batches (answered as Arrow).",
    metric="Due time → first snapshot showing the offset (\"visible\", including up to 10 ms of polling); ack → "
           "visible isolates the WAL→Delta path; a median that grows from the run's first fifth to its last "
           "means a growing backlog. The idle run is the flood run's same-run baseline.",
    target=f"visible p99 ≤ {TARGET_P99_S:g} s in every run, no acknowledged message left invisible; serve's peak RSS ≤ "
           f"{TARGET_RSS_MB} MB.",
)
