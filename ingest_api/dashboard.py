"""The dashboard's data: one JSON snapshot of topics, subscriptions, jobs and dead letters.

`Dashboard.snapshot()` is the one place the figures are computed; `GET /v1/dashboard` serves
it and the page at `/` (ingest_api/static/) polls it. Every reader of the page shares one
snapshot for `CACHE_S`, so ten open tabs cost the tables no more than one.

The figures and where they come from:

* topics: per partition the log-start offset and size (Delta log statistics, no data read),
  the log-end offset (the broker, WAL included) and the committed end (in Delta); the produce
  rate is the change of the summed log-end offsets over the last `RATE_WINDOW_S`, sampled at
  each snapshot (`ProduceRates`).
* subscriptions: the per-partition status of ingest_api/subscription_status.py, summed.
  `produced` is the high watermark, `pending` the lag, `dead_lettered` the letters not
  yet replayed, and `delivered` the rest of the offsets the group has passed
  (produced - pending - dead_lettered). Like a Kafka consumer's offset, it counts from offset
  0, so it includes messages a `start: latest` subscription passed over when it was created.
* jobs: the newest runs of compaction, retention and replication from `_system/job_runs`
  (tables/job_runs.py), one entry per run with its tables summed.
* dead letters: the first `DEAD_LETTERS_PER_SUBSCRIPTION` not yet replayed, per subscription.
* history: each subscription's delivered and dead-lettered per second and lag over the last 15
  minutes (ingest_api/dashboard_history.py), sampled every SAMPLE_S by `Dashboard.sample`.
* replays by predicate: each subscription's newest `REPLAYS_PER_SUBSCRIPTION`, with their progress
  (tables/replays.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.dashboard_history import SAMPLE_S, Sample, SubscriptionHistory
from lakebroker.ingest_api.live_status import LiveStatus
from lakebroker.ingest_api.reader import log_start, partition_files
from lakebroker.ingest_api.subscription_status import GroupTables, pull_group_lags, read_groups, subscription_status
from lakebroker.tables.dead_letters import DeadLetterTable
from lakebroker.tables.errors import TableUnreadable
from lakebroker.tables.job_runs import JobName, last_runs
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_start import PartitionLog
from lakebroker.tables.lost_offsets import LostOffsets, lost_offsets
from lakebroker.tables.offsets import OffsetsTable
from lakebroker.tables.replays import ReplayTable
from lakebroker.tables.subscriptions import Subscription, SubscriptionStore
from lakebroker.tables.tokens import ApiToken
from lakebroker.tables.topics import TopicConfig

log = logging.getLogger(__name__)

CACHE_S = 0.5
RATE_WINDOW_S = 5.0
JOBS = (JobName.COMPACTION, JobName.RETENTION, JobName.REPLICATION)
RUNS_PER_JOB = 5
DEAD_LETTERS_PER_SUBSCRIPTION = 50
REPLAYS_PER_SUBSCRIPTION = 3


class ProduceRates:
    """Messages per second per topic, from log-end samples kept in a small ring per topic."""

    def __init__(self, window_s: float = RATE_WINDOW_S, min_spacing_s: float = 0.2) -> None:
        self.window_s = window_s
        self.min_spacing_s = min_spacing_s
        self._samples: dict[str, deque[tuple[float, int]]] = {}

    def observe(self, topic: str, assigned_end: int, now: float) -> float | None:
        """Record the topic's summed log end at `now`; the rate over the window, None until two samples."""
        ring = self._samples.setdefault(topic, deque())
        if ring and assigned_end < ring[-1][1]:  # the topic was deleted and made again
            ring.clear()
        if not ring or now - ring[-1][0] >= self.min_spacing_s:
            ring.append((now, assigned_end))
        while len(ring) > 2 and now - ring[1][0] >= self.window_s:
            ring.popleft()
        first_t, first_end = ring[0]
        if len(ring) < 2 or now <= first_t:
            return None
        return (assigned_end - first_end) / (now - first_t)

    def forget_except(self, topics: set[str]) -> None:
        for name in set(self._samples) - topics:
            del self._samples[name]


@dataclass(frozen=True)
class _TableReads:
    """Everything the snapshot reads from Delta, read in one worker thread."""

    files: dict[str, dict[int, PartitionLog]]
    subscriptions: dict[str, Subscription]
    groups: GroupTables
    dead_letters: dict[str, list[dict[str, Any]]]
    runs: dict[str, list[dict[str, Any]]]
    losses: list[LostOffsets]
    unreadable: dict[str, str]  # topic -> why its table could not be read
    replays: dict[str, list[dict[str, Any]]]  # subscription -> its newest replays


def _read_tables(layout: Layout, topics: list[TopicConfig], offsets: OffsetsTable) -> _TableReads:
    files: dict[str, dict[int, PartitionLog]] = {}
    unreadable: dict[str, str] = {}
    for t in topics:
        try:
            files[t.name] = partition_files(layout, t)
        except TableUnreadable as exc:  # that topic shows as unavailable; the page goes on
            unreadable[t.name] = exc.message
    subs = SubscriptionStore(layout).load()
    unreplayed = DeadLetterTable(layout).unreplayed(DEAD_LETTERS_PER_SUBSCRIPTION)
    groups = read_groups(layout, offsets=offsets, dead_letters={g: n for g, (n, _) in unreplayed.items()})
    letters = {name: unreplayed[name][1] for name in sorted(subs) if name in unreplayed}
    runs = {job.value: last_runs(layout, job=job.value, limit=200) for job in JOBS}
    replays = ReplayTable(layout)
    newest = {name: [r.public() for r in replays.replays(name)[:REPLAYS_PER_SUBSCRIPTION]] for name in subs}
    return _TableReads(files, subs, groups, letters, runs, lost_offsets(layout), unreadable, newest)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def summarize_runs(rows: list[dict[str, Any]], limit: int = RUNS_PER_JOB) -> list[dict[str, Any]]:
    """job_runs rows (one per run and table, newest first) as one entry per run."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["run_id"] in runs or len(runs) < limit:
            runs.setdefault(row["run_id"], []).append(row)
    out = []
    for run_id, parts in runs.items():
        tables = [r for r in parts if r["target"]]
        whole = next((r for r in parts if not r["target"]), None)
        outcomes = {r["outcome"] for r in parts}
        outcome = "failed" if "failed" in outcomes else "skipped" if outcomes == {"skipped"} else "ok"

        def total(column: str, tables: list[dict[str, Any]] = tables) -> int | None:
            values = [r[column] for r in tables if r[column] is not None]
            return sum(values) if values else None

        out.append({
            "run_id": run_id,
            "trigger": parts[0]["trigger"],
            "started_at": _iso(parts[0]["started_at"]),
            "outcome": outcome,
            "duration_ms": whole["duration_ms"] if whole is not None else sum(r["duration_ms"] for r in tables),
            "tables": sum(1 for r in tables if r["outcome"] != "skipped"),  # tables the run worked on
            "files_before": total("files_before"),
            "files_after": total("files_after"),
            "bytes_before": total("bytes_before"),
            "bytes_after": total("bytes_after"),
            "rows_removed": total("rows_removed"),
            "error": next((r["error"] for r in parts if r["error"]), None),
            "topics": sorted({r["topic"] for r in tables if r["topic"]}),
        })
    return out


def _endpoint(status: dict[str, Any], sub: Subscription) -> tuple[str, str | None]:
    """The card's endpoint state and its last error: the subscription's health (`health` in
    subscription_status.py, the one judge of it), told apart further where the page can: disabled,
    paused, circuit_open (health `open`), backing_off (health `failing`), healthy (answering),
    or idle (no send since the worker started). A healthy endpoint keeps its last error on show."""
    health = status["health"]
    errors = [p["last_error"] for p in status["partitions"] if p["last_error"]]
    last_error = health["last_error"] or (errors[0] if errors else None)
    if health["state"] == "disabled":
        return "disabled", last_error
    if sub.paused:
        return "paused", last_error
    if health["state"] in ("open", "failing"):
        return ("circuit_open" if health["state"] == "open" else "backing_off"), last_error
    answered = any(p["last_status"] is not None or p["delivered"] for p in status["partitions"])
    states = {p["state"] for p in status["partitions"]}
    return ("healthy" if "healthy" in states and answered else "idle"), last_error


class Dashboard:
    def __init__(self, broker: Broker, worker: LiveStatus | None) -> None:
        self.broker = broker
        self.worker = worker
        self.rates = ProduceRates()
        self._offsets = OffsetsTable(broker.layout)  # follows the table's log between snapshots
        self._lock = asyncio.Lock()
        self._cached: dict[str, Any] | None = None
        self._cached_at = -float("inf")
        self.history = SubscriptionHistory()

    async def sample(self, every_s: float = SAMPLE_S) -> None:
        """Every `every_s` until cancelled, observe each subscription's totals for the charts:
        from the subscription, offset and dead-letter tables alone (no topic's files, no job runs),
        and nothing more than the subscription list while there is no subscription."""
        while True:
            await asyncio.sleep(every_s)
            try:
                async with self._lock:  # the offsets table is followed by one reader at a time
                    await self._sample()
            except Exception:  # a table unreadable for a moment: the next sample tries again
                log.warning("dashboard: a history sample failed", exc_info=True)

    async def _sample(self) -> None:
        layout = self.broker.layout
        subs = await asyncio.to_thread(SubscriptionStore(layout).load)
        if subs:
            await self.broker.follow_all_ends()
            groups = await asyncio.to_thread(read_groups, layout, offsets=self._offsets)
            self._observe([self._subscription(s, groups) for s in subs.values()])
        else:
            self.history.forget_except(set())

    def _observe(self, subs: list[dict[str, Any]]) -> None:
        at = time.time()
        for sub in subs:
            self.history.observe(sub["name"], Sample(at, sub["delivered"], sub["dead_lettered"], sub["pending"]))
        self.history.forget_except({sub["name"] for sub in subs})

    async def snapshot(self) -> dict[str, Any]:
        """The current snapshot, recomputed at most every CACHE_S whoever asks."""
        async with self._lock:
            if self._cached is None or time.monotonic() - self._cached_at >= CACHE_S:
                self._cached = await self._compute()
                self._cached_at = time.monotonic()
            return self._cached

    async def _compute(self) -> dict[str, Any]:
        broker = self.broker
        topics = sorted(broker.topics.values(), key=lambda t: t.name)
        await broker.follow_all_ends()
        reads = await asyncio.to_thread(_read_tables, broker.layout, topics, self._offsets)
        now = time.monotonic()
        topic_rows = [self._topic(t, reads.files.get(t.name, {}), now, reads.unreadable.get(t.name)) for t in topics]
        self.rates.forget_except({t.name for t in topics})
        subs = [{**self._subscription(s, reads.groups), "replays": reads.replays.get(s.name, [])}
                for s in sorted(reads.subscriptions.values(), key=lambda s: s.name)]
        self._observe(subs)
        for sub in subs:
            sub["history"] = self.history.series(sub["name"])
        letters = []
        for name, rows in reads.dead_letters.items():
            for r in rows:
                letters.append({
                    "subscription": name, "topic": r["topic"], "partition": r["partition"], "offset": r["offset"],
                    "attempts": r["attempts"], "last_status": r["last_status"], "last_error": r["last_error"],
                    "dead_at": _iso(r["dead_at"]), "replay_requested_at": _iso(r["replay_requested_at"]),
                })
        return {
            "generated_at": datetime.now(UTC).isoformat(),
            "topics": topic_rows,
            "subscriptions": subs,
            "groups": pull_group_lags(broker, reads.groups.committed),
            "jobs": {job: summarize_runs(rows) for job, rows in reads.runs.items()},
            "dead_letters": letters,
            "lost_offsets": self._lost(reads.losses),
        }

    def _lost(self, losses: list[LostOffsets]) -> list[dict[str, Any]]:
        """Offsets WAL damage lost: held partitions first (they wait for `wal skip`), then the
        losses already skipped, newest first."""
        held = [{**d.public(), "state": "held", "skipped_at": None, "skipped_by": None}
                for d in self.broker.damage.all()]
        skipped = [{"topic": s.topic, "partition": s.partition, "first_offset": s.first_offset,
                    "last_offset": s.last_offset, "lost": s.count, "wal_damage": s.wal_damage, "state": "skipped",
                    "skipped_at": _iso(s.skipped_at), "skipped_by": s.skipped_by} for s in reversed(losses)]
        return held + skipped

    def _topic(self, topic: TopicConfig, files: dict[int, PartitionLog], now: float,
               unreadable: str | None) -> dict[str, Any]:
        partitions = []
        for p in range(topic.partitions):
            f = files.get(p)
            committed = self.broker.committed_end(topic, p)
            partitions.append({
                "partition": p, "log_start_offset": log_start(f, committed),
                "log_end_offset": self.broker.assigned_end(topic, p), "high_watermark": committed,
                "committed_offset": committed,  # deprecated: high_watermark
                "size_bytes": f.size_bytes if f else 0, "files": f.files if f else 0, "rows": f.rows if f else 0,
            })
        assigned = sum(p["log_end_offset"] for p in partitions)
        return {
            "name": topic.name,
            "partitions": partitions,
            "log_end_offset": assigned,
            "messages": sum(p["rows"] for p in partitions),
            "size_bytes": sum(p["size_bytes"] for p in partitions),
            "files": sum(p["files"] for p in partitions),
            "produce_rate": self.rates.observe(topic.name, assigned, now),
            "unavailable": unreadable or self.broker.ownership.unreadable.get(topic.topic_id),
        }

    def _subscription(self, sub: Subscription, groups: GroupTables) -> dict[str, Any]:
        status = subscription_status(self.broker, self.worker, sub, groups)
        produced = sum(p["high_watermark"] for p in status["partitions"])
        pending = sum(p["lag"] for p in status["partitions"])
        dead = status["dead_letters"]
        state, last_error = _endpoint(status, sub)
        return {
            "name": sub.name, "topic": sub.topic, "url": sub.url, "filter": sub.filter, "endpoint_state": state,
            "disabled_reason": sub.disabled_reason, "last_error": last_error,
            "last_status": next((p["last_status"] for p in status["partitions"] if p["last_status"]), None),
            "produced": produced, "pending": pending, "dead_lettered": dead,
            "delivered": max(0, produced - pending - dead), "in_flight": sum(p["in_flight"] for p in
                                                                            status["partitions"]),
            "partitions": [{k: p[k] for k in _SUB_PARTITION_KEYS} for p in status["partitions"]],
        }


_SUB_PARTITION_KEYS = ("partition", "committed_offset", "high_watermark", "log_end_offset", "lag", "in_flight",
                       "state", "last_error")


def for_principal(snapshot: dict[str, Any], principal: ApiToken) -> dict[str, Any]:
    """The snapshot as a token limited to some topics may see it."""
    if principal.topics is None:
        return snapshot
    allowed = principal.allows_topic
    return {
        **snapshot,
        "topics": [t for t in snapshot["topics"] if allowed(t["name"])],
        "subscriptions": [s for s in snapshot["subscriptions"] if allowed(s["topic"])],
        "groups": [g for g in snapshot["groups"] if allowed(g["topic"])],
        "dead_letters": [d for d in snapshot["dead_letters"] if allowed(d["topic"])],
        "lost_offsets": [d for d in snapshot["lost_offsets"] if allowed(d["topic"])],
        "jobs": {job: [r for r in runs if r["topics"] and all(allowed(t) for t in r["topics"])]
                 for job, runs in snapshot["jobs"].items()},
    }
