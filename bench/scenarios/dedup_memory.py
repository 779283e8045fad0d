"""The dedup index's memory and cost per operation at the default 2,000,000 ids, beside a plain OrderedDict
of tuples; and `lakebroker serve`'s RSS with a full index and after a restart rebuilds it.

Each index figure comes from a fresh child process (`python -m bench.scenarios.dedup_memory KIND N`, or
`timing N`), so one index's memory does not weigh on the other's.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx

from bench.harness.memory import status_mb
from bench.harness.servers import NO_JOBS, create_topic, lakebroker_server
from bench.harness.wrk import DONE_LUA, run_wrk
from bench.result import REPO, Check, Mode, Result, Scenario, table
from lakebroker.ingest_api.dedup import DedupIndex, DedupKey, Placed
from lakebroker.tables.settings import Settings

TARGET_SERVE_RSS_MB = 300  # the ingest memory target: serve's peak resident memory
IDS = {"full": 2_000_000, "quick": 500_000, "tiny": 20_000}  # each index's max_entries; serve is sent 10% more
SERVE_CHUNK_S = {"full": 10, "quick": 10, "tiny": 2}  # each wrk run of the serve fill
SERVE_MAX_CHUNKS = 30  # bounds the fill: 300 s
TOPICS = [f"{t:032x}" for t in (0x5F1D0C2A9B8E4F7C, 0x1B2C3D4E5F60718A, 0x99AA00BB11CC22DD, 0x0123456789ABCDEF)]
OPS = 20_000  # per timing round (fewer when the index holds fewer than ROUNDS * OPS ids)
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
    per_round = min(OPS, n // ROUNDS)
    indexes = {kind: filled(kind, n, now_us) for kind in KINDS}
    future: asyncio.Future[Placed] = asyncio.new_event_loop().create_future()
    times: dict[str, dict[str, list[float]]] = {kind: {"hit_us": [], "new_us": []} for kind in KINDS}
    for r in range(ROUNDS):
        present = [key(i) for i in range(n - (r + 1) * per_round, n - r * per_round)]
        fresh = [key(i) for i in range(n + r * per_round, n + (r + 1) * per_round)]
        for kind in KINDS if r % 2 == 0 else reversed(KINDS):
            index = indexes[kind]
            lookup, begin, remember = index.lookup, index.begin, index.remember
            started = time.process_time()
            for k in present:  # a retried send
                lookup(k)
            times[kind]["hit_us"].append((time.process_time() - started) / per_round * 1e6)
            started = time.process_time()
            for k in fresh:  # a new message with an id, as the broker places it
                if lookup(k) is None:
                    begin(k, future)
                    remember(k, (3, 1_000_000_000, now_us))
            times[kind]["new_us"].append((time.process_time() - started) / per_round * 1e6)
    return {kind: {op: statistics.median(v) for op, v in ops.items()} for kind, ops in times.items()}


def _child(*argv: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "bench.scenarios.dedup_memory", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# Batches of 1,000 messages, each with a UUID-shaped id no other request of the run carries.
_IDS_LUA = """-- generated by bench/scenarios/dedup_memory.py
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


def serve_full_index(n: int, work: Path, chunk_s: float = SERVE_CHUNK_S["full"]) -> dict[str, Any]:
    """`serve` with its default dedup settings, sent n ids (more than its dedup_max_entries when n
    is the default's) in batches by wrk; its RSS then, and again after a restart rebuilds the index
    from the topic's table."""
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
        full_rss, full_peak = status_mb(server.pid, "VmRSS") or 0.0, status_mb(server.pid, "VmHWM") or 0.0
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
        restart_rss, restart_peak = status_mb(again.pid, "VmRSS") or 0.0, status_mb(again.pid, "VmHWM") or 0.0
    finally:
        again.stop()
    answer = retry.json()["results"][0] if retry.status_code == 200 else {}
    return {"ids_sent": sent, "errors": errors, "fill_s": fill_s, "idle_mb": idle_mb, "full_rss_mb": full_rss,
            "full_peak_mb": full_peak, "ring_mb": ring_mb, "restart_ready_s": ready_s,
            "restart_rss_mb": restart_rss, "restart_peak_mb": restart_peak,
            "retry_duplicate": answer == {"partition": retried[0], "offset": retried[1], "duplicate": True,
                                          "timestamp": answer.get("timestamp")}}


def _newest_id(table_path: Path) -> tuple[int, int, str]:
    """(partition, offset, message id) of the table's newest row in partition 0."""
    from deltalake import DeltaTable  # here, not at the top: the index children stay without it

    rows = DeltaTable(str(table_path)).to_pyarrow_table(columns=["partition", "offset", "message_id"],
                                                         filters=[("partition", "=", 0)])
    newest = rows.sort_by([("offset", "descending")]).slice(0, 1).to_pylist()[0]
    return newest["partition"], newest["offset"], newest["message_id"]


def report(n: int, indexes: dict[str, dict[str, float]], serve: dict[str, Any]) -> Result:
    """The Result of one run: `indexes` by kind (memory and timing), `serve` from serve_full_index."""
    compact, keeps = indexes["compact"], Settings().dedup_max_entries
    verdict = ("answered as a duplicate, with its placement" if serve["retry_duplicate"]
               else "NOT answered as a duplicate of its placement")
    return Result(
        scenario="dedup_memory",
        checks=[Check("serve's peak RSS, full dedup index", serve["full_peak_mb"], "MB", TARGET_SERVE_RSS_MB,
                      higher_is_better=False),
                Check("serve's peak RSS, restart rebuilding the index", serve["restart_peak_mb"], "MB",
                      TARGET_SERVE_RSS_MB, higher_is_better=False)],
        headlines=[f"dedup index, {n:,} ids: {compact['rss_mb'] * 2**20 / n:.0f} B of RSS per id, "
                   f"{compact['rss_mb']:.0f} MB; lookup {compact['hit_us']:.2f} µs, new id {compact['new_us']:.2f} µs"],
        tables=[
            table(f"Each index filled to its max_entries, {n:,} ids.",
                  ["index", "RSS growth, MB (B per id)", "RSS peak growth", "fill, µs per id", "lookup, known id",
                   "new id"],
                  [[KINDS[kind][0], f"{r['rss_mb']:,.0f} ({r['rss_mb'] * 2**20 / n:,.0f})", f"{r['peak_mb']:,.0f} MB",
                    f"{r['fill_us']:.2f}", f"{r['hit_us']:.2f} µs", f"{r['new_us']:.2f} µs"]
                   for kind, r in indexes.items()]),
            table(f"`lakebroker serve` (default `dedup_max_entries`, {keeps:,}) sent {serve['ids_sent']:,} ids"
                  f"{', more than it keeps,' if serve['ids_sent'] > keeps else ''} by wrk in {serve['fill_s']:.0f} s "
                  f"({serve['errors']:,} failed requests), then restarted on the same data directory.",
                  ["serve", "RSS", "peak RSS"],
                  [["idle, before any id", f"{serve['idle_mb']:.0f} MB", ""],
                   [f"after {serve['ids_sent']:,} ids", f"{serve['full_rss_mb']:.0f} MB",
                    f"{serve['full_peak_mb']:.0f} MB"],
                   [f"restarted, index rebuilt ({serve['restart_ready_s']:.1f} s to ready)",
                    f"{serve['restart_rss_mb']:.0f} MB", f"{serve['restart_peak_mb']:.0f} MB"]]),
        ],
        notes=[
            f"`DedupIndex` takes {compact['rss_mb'] * 2**20 / n:,.0f} B of RSS per id against the OrderedDict's "
            f"{indexes['tuples']['rss_mb'] * 2**20 / n:,.0f}: it keeps in memory, per id, the low 32 bits of its "
            "128-bit hash and its ring position in a slot table at most half full; the full hash and the placement "
            "are 40-byte records in a ring file beside the WAL (`data/dedup/`), read only when those 32 bits match. "
            "Its memory is mapped at its full size and becomes resident as ids arrive: nothing is copied to grow. "
            "CPU times are from a shared machine: compare the rows of one run.",
            f"serve's ring file: {serve['ring_mb']:.0f} MB on disk. A retried send of the newest id of partition 0 "
            f"after the restart was {verdict}.",
        ],
        figures={"ids": n, "indexes": indexes, "serve": serve},
    )


def measure(mode: Mode, work: Path) -> Result:
    n = IDS[mode]
    indexes = {kind: _child(kind, str(n)) for kind in KINDS}
    for kind, costs in _child("timing", str(n)).items():
        indexes[kind].update(costs)
    return report(n, indexes, serve_full_index(n + n // 10, work, SERVE_CHUNK_S[mode]))


SCENARIO = Scenario(
    name="dedup_memory", title="Dedup index: memory and cost per operation", measure=measure, timeout_s=1200,
    setup="The product's `DedupIndex` and, as the comparison, a plain OrderedDict of (topic id, id) → (partition, "
          "offset, timestamp) tuples with the same eviction, each filled to its max_entries, 2,000,000 ids "
          "(UUID-shaped message ids over four topics, each with a partition, an offset and a log-append time), in "
          "a fresh process; a last process holds both full indexes. Then one `lakebroker serve` on 127.0.0.1 "
          "(scheduled jobs off) with its default dedup settings and a topic of 3 partitions.",
    load=f"The fill; then, with both indexes full and their rounds alternating, {ROUNDS} rounds of {OPS:,} "
         "operations of each kind: a lookup of a known id (a retried send), and for a new id the broker's sequence, "
         "a lookup that misses, begin and remember, which evicts the oldest id. serve is sent at least 2,200,000 "
         "ids, more than it keeps, in JSON batches of 1,000 100-byte messages by wrk (4 connections, 10 s runs, at "
         "most 30), stopped, and restarted on the same data directory, where it rebuilds the index from the "
         "topic's table; then one retried send of the newest id of partition 0.",
    metric="Per index: its RSS growth (and bytes per id), its RSS peak growth while filling, the CPU time per id "
           "of the fill, and the median CPU time per operation. For serve: RSS and peak RSS (the kernel's VmHWM) "
           "idle, with a full index, and after the restart's rebuild; the restart's time to ready; the ring "
           "file's size; whether the retry is answered as a duplicate with its placement.",
    target=f"serve's peak RSS ≤ {TARGET_SERVE_RSS_MB} MB (the ingest memory target) with a full index and after "
           "the restart's rebuild.",
)

if __name__ == "__main__":  # `_child`'s process: `KIND N` or `timing N`, one JSON line on stdout
    what, entries = sys.argv[1], int(sys.argv[2])
    print(json.dumps(timing(entries) if what == "timing" else memory(what, entries)))
