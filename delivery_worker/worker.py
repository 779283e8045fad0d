"""The delivery worker: keeps one pipeline running per (subscription, partition) it leases.

Each tick reads like a checklist: load subscriptions → stop what is no longer wanted →
heartbeat leases → apply seeks → start pipelines for new leases → report status.
Between ticks, and during a slow one, the membership and the leases held are renewed every
heartbeat on their own (`_renew_loop`): a tick's table reads can outlast a lease on a loaded machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from lakebroker.delivery_worker.breaker import State as BreakerState
from lakebroker.delivery_worker.commit_watch import CommitWatch
from lakebroker.delivery_worker.flow import ByteBudget
from lakebroker.delivery_worker.http1 import LeanTransport
from lakebroker.delivery_worker.metrics import DeliveryMetrics
from lakebroker.delivery_worker.operational import OperationalWebhooks
from lakebroker.delivery_worker.pipeline import PartitionPipeline, PipelineStatus
from lakebroker.delivery_worker.sender import Sender
from lakebroker.delivery_worker.sending import Endpoint, Gone
from lakebroker.delivery_worker.source import LogTails, PartitionSource
from lakebroker.tables.dead_letters import DeadLetterTable
from lakebroker.tables.layout import Layout
from lakebroker.tables.leases import Lease, LeaseTable, Pair
from lakebroker.tables.offsets import Committed, Fence, OffsetReason, OffsetsTable, Position
from lakebroker.tables.replays import ReplayPart, ReplayTable
from lakebroker.tables.settings import Settings
from lakebroker.tables.subscriptions import Subscription, SubscriptionStore
from lakebroker.tables.topics import TopicConfig, TopicStore

log = logging.getLogger(__name__)

# A tick running for this many lease TTLs is stuck (a hung table read): the renewals stop, so its
# partitions go to other workers, as they would if the whole worker had stopped.
STUCK_TICK_TTLS = 10
REPLAY_GIVE_UP_S = 300.0  # a replay by predicate failing this long with no progress fails, with its error


def _config(sub: Subscription) -> Subscription:
    """The part of a subscription whose change restarts its pipelines (not seeks, not state)."""
    return replace(sub, seek_epoch=0, seek_offsets=None, paused=False, disabled_reason=None, failing_since=None)


@dataclass
class _Running:
    pipeline: PartitionPipeline
    task: asyncio.Task[None]
    config: Subscription
    seek_epoch: int


class DeliveryWorker:
    def __init__(self, settings: Settings, metrics: DeliveryMetrics, worker_id: str | None = None) -> None:
        self.settings = settings
        self.layout = Layout.of(settings)
        self.metrics = metrics
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self.subscriptions = SubscriptionStore(self.layout)
        self.topics = TopicStore(self.layout)
        self.offsets = OffsetsTable(self.layout)
        self.dead_letters = DeadLetterTable(self.layout)
        self.replays = ReplayTable(self.layout)
        self.leases = LeaseTable(self.layout, self.worker_id, settings.lease_ttl_s)
        self._running: dict[Pair, _Running] = {}
        self._endpoints: dict[str, tuple[Subscription, Endpoint]] = {}
        self._held: dict[Pair, Lease] = {}
        self._transport: LeanTransport | None = None
        self._sender: Sender | None = None
        self._commits = CommitWatch()
        self._tails = LogTails()  # one per topic table, shared by its pipelines (source.py)
        self._read_ahead = ByteBudget(settings.delivery_read_ahead_total_bytes)  # shared by its pipelines
        self._to_disable: dict[str, str] = {}  # by subscription: why (a 410 Gone, failing past disable_after)
        self._circuits: dict[str, BreakerState] = {}  # by subscription: its circuit's state, as last changed
        self._operational = OperationalWebhooks.of(settings)
        self._commit_lock = asyncio.Lock()  # a pipeline's final commit and the batch commit never interleave
        self._replays: dict[Pair, asyncio.Task[None]] = {}  # of dead letters
        self._matching: dict[Pair, asyncio.Task[None]] = {}  # replays by predicate: one at a time per pair
        # (replay id, partition, its recorded progress) -> its first failure there
        self._replay_failing: dict[tuple[str, int, int], float] = {}
        self.ticks = 0  # completed ticks: a change to subscriptions is applied once a tick begun after it ends
        self._tick_began: float | None = None  # monotonic; None between ticks
        self._renewed_at: float | None = None  # monotonic: when the last renewal that landed began

    # -- lifecycle ----------------------------------------------------------------------
    async def run(self) -> None:
        self._transport = LeanTransport(allow_private=self.settings.allow_private_webhooks)
        self._sender = Sender(self._transport, self.worker_id, self._read_ahead)
        loops = [asyncio.create_task(self._commit_loop()), asyncio.create_task(self._renew_loop())]
        try:
            while True:
                self._tick_began = time.monotonic()
                try:
                    await self.tick()
                except Exception:
                    log.exception("delivery worker %s: tick failed; retrying", self.worker_id)
                finally:
                    self._tick_began = None
                self.ticks += 1
                await asyncio.sleep(self.settings.heartbeat_s)
        finally:
            for loop in loops:
                loop.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop
            await self.shutdown()

    async def shutdown(self) -> None:
        """Stop every pipeline, commit what was delivered, and release the leases."""
        for task in [*self._replays.values(), *self._matching.values()]:
            task.cancel()
        pairs = set(self._running)
        await self._stop(pairs, commit=True)
        if pairs:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.leases.heartbeat, [], pairs, {}, {})
        await self._commits.aclose()
        if self._transport is not None:
            await self._transport.aclose()
            self._transport = None
        if self._operational is not None:
            await self._operational.aclose()

    # -- one tick -----------------------------------------------------------------------
    async def tick(self) -> None:
        subs = await asyncio.to_thread(self.subscriptions.load)
        await self._record_health(subs)
        await self._disable(subs)
        topics = await asyncio.to_thread(self.topics.load)
        active = {n: s for n, s in subs.items() if s.active and s.topic in topics}
        pairs = [(n, p) for n, s in active.items() for p in range(topics[s.topic].partitions)]

        desired = await asyncio.to_thread(self.leases.desired, pairs)
        release: set[Pair] = set()
        restart: set[Pair] = set()
        for pair, current in self._running.items():
            sub = active.get(pair[0])
            if (pair not in desired or sub is None or _config(sub) != current.config
                    or current.pipeline.fence.topic_id != topics[sub.topic].topic_id  # deleted and re-created
                    or current.pipeline.status.state == "disabled"):
                release.add(pair)
            elif current.task.done():  # a crashed pipeline: restarted below, under the lease it holds
                crash = None if current.task.cancelled() else current.task.exception()
                log.error("pipeline of %s partition %d stopped; restarting it", *pair, exc_info=crash)
                restart.add(pair)
        await self._stop(release | restart, commit=True)
        for name in [n for n in self._endpoints if n not in active]:
            self._forget_endpoint(name)

        statuses = {pair: orjson.dumps(r.pipeline.status.as_dict()).decode() for pair, r in self._running.items()}
        applied = {pair: r.seek_epoch for pair, r in self._running.items()}
        beat_began = time.monotonic()
        self._held = await asyncio.to_thread(self.leases.heartbeat, pairs, release, statuses, applied)
        self._renewed_at = max(self._renewed_at or 0.0, beat_began)

        lost = {p for p in self._running if p not in self._held}
        for pair in sorted(lost):
            log.warning("lost the lease of %s partition %d", *pair)
        stale: set[Pair] = set()  # restarted from the committed offset (a seek, or a fenced pipeline)
        for pair, lease in self._held.items():
            sub, running = active.get(pair[0]), self._running.get(pair)
            if sub is None or running is None:
                continue
            if running.seek_epoch < sub.seek_epoch:
                stale.add(pair)
            elif lease.epoch == running.pipeline.fence.epoch + 1 and lease.owner == self.worker_id:
                # Its lease ran out between two renewals and this heartbeat took it again: the one
                # take since the pipeline's own, so no other worker held the pair in between, and
                # delivery goes on from where it is, under the new epoch.
                log.warning("the lease of %s partition %d ran out before this worker renewed it; taken again at "
                            "epoch %d with no other holder in between", *pair, lease.epoch)
                running.pipeline.fence = replace(running.pipeline.fence, epoch=lease.epoch)
            elif running.pipeline.fence.epoch != lease.epoch:
                # Held at both heartbeats but not throughout: while this worker stalled past its
                # lease, another took the pair (a higher epoch) and committed; the pipeline's
                # commits are fenced out now, so it restarts from the committed offset.
                log.warning("the lease of %s partition %d changed hands meanwhile (its pipeline's epoch %d, the "
                            "lease's now %d, held by %s); restarting from its commit", *pair,
                            running.pipeline.fence.epoch, lease.epoch, lease.owner)
                stale.add(pair)
        await self._stop(lost | stale, commit=False)  # the next holder, or the seek, may have moved on
        for running in self._running.values():
            running.pipeline.lease_renewed()  # its sends in progress may run until the renewed lease's end

        self._tails.retain({(r.pipeline.source.uri, r.pipeline.fence.topic_id) for r in self._running.values()})
        starts = [(active[n], p, lease) for (n, p), lease in self._held.items()
                  if n in active and (n, p) not in self._running]
        if starts:
            # One read of the offsets table for every start: taking over many partitions must not
            # cost one table read each, or the tick outlasts the lease it is renewing.
            committed = await asyncio.to_thread(self.offsets.positions, topics=topics)
            for sub, partition, lease in starts:
                await self._start(sub, topics[sub.topic], partition, lease,
                                  committed.get((sub.name, sub.topic, partition)))

    async def _renew_loop(self) -> None:
        """Renew the membership and the leases of the running pipelines every heartbeat, whatever a
        tick is doing: a worker that holds nothing yet must stay a member too, or the others plan
        without it and keep its share. What a tick renewed within the last two heartbeats is left to
        the ticks: on a machine with time to spare this loop commits nothing."""
        ttl, heartbeat = self.settings.lease_ttl_s, self.settings.heartbeat_s
        stuck_s = STUCK_TICK_TTLS * ttl
        due_s = min(2 * heartbeat, ttl / 2)  # renew once the last renewal is this old
        while True:
            await asyncio.sleep(heartbeat)
            began = self._tick_began
            if began is not None and time.monotonic() - began > stuck_s:
                continue
            if self._renewed_at is None or time.monotonic() - self._renewed_at < due_s:
                continue  # not a member yet (the first tick joins), or renewed lately
            started = time.monotonic()
            try:
                renewed = await asyncio.to_thread(self.leases.renew, set(self._running))
            except Exception:
                log.exception("delivery worker %s: lease renewal failed; retrying", self.worker_id)
                continue
            ran_out = [pair for pair in self._running if pair in self._held and pair not in renewed]
            if ran_out or time.monotonic() - started > ttl / 2:
                log.warning("renewing the leases took %.1f s, %.1f s after the last renewal began (lease TTL %.0f s); "
                            "%d of them had run out already", time.monotonic() - started,
                            started - self._renewed_at, ttl, len(ran_out))
            self._renewed_at = max(self._renewed_at, started)
            for pair, lease in renewed.items():
                held, running = self._held.get(pair), self._running.get(pair)
                # Only a lease the tick still counts as held, at the same epoch: a tick that ended
                # meanwhile may have released it or seen it change hands.
                if held is not None and held.epoch == lease.epoch and lease.expires_at > held.expires_at:
                    self._held[pair] = lease
                    if running is not None:
                        running.pipeline.lease_renewed()

    # -- pipelines ----------------------------------------------------------------------
    def _endpoint(self, sub: Subscription) -> Endpoint:
        known = self._endpoints.get(sub.name)
        if known is None or _config(known[0]) != _config(sub):
            known = (sub, Endpoint.for_subscription(sub, functools.partial(self._breaker_changed, sub)))
            self._endpoints[sub.name] = known
            self.metrics.circuit_open.labels(sub.name).set(0)
        return known[1]

    def _forget_endpoint(self, name: str) -> None:
        """A subscription paused, disabled or deleted: its endpoint and circuit go with it, so one
        resumed starts with a closed circuit (the operator has said the endpoint is mended), not one
        still open for a cool-down that would outlast its disable_after and disable it again."""
        del self._endpoints[name]
        self._circuits.pop(name, None)
        self.metrics.circuit_open.labels(name).set(0)

    def _breaker_changed(self, sub: Subscription, state: BreakerState) -> None:
        known = self._endpoints.get(sub.name)
        if known is None or known[0] is not sub:
            return  # a forgotten or replaced endpoint's breaker, moved by a send still finishing
        self._circuits[sub.name] = state
        self.metrics.circuit_open.labels(sub.name).set(0 if state is BreakerState.CLOSED else 1)
        if state is BreakerState.OPEN:
            log.warning("subscription %s: %d endpoint failures in a row; its circuit is open, a probe goes in "
                        "%.0f s or later", sub.name, sub.breaker_failures, sub.breaker_cooldown_ms / 1000)
        elif state is BreakerState.CLOSED:
            log.info("subscription %s: the endpoint answered; its circuit is closed", sub.name)

    async def _start(self, sub: Subscription, topic: TopicConfig, partition: int, lease: Lease,
                     found: Committed | None) -> None:
        assert self._sender is not None
        pair = (sub.name, partition)
        if found is not None and found.epoch >= lease.epoch:  # our token must outrank every earlier commit
            raised = await asyncio.to_thread(self.leases.raise_epoch, pair, found.epoch + 1)
            if raised is None:
                return  # the lease is gone: the next tick sorts it out
            lease = self._held[pair] = raised
        fence = Fence(topic.topic_id, lease.epoch)
        start = await self._start_offset(sub, topic, partition, lease, fence, None if found is None else found.offset)
        source = PartitionSource(self.layout, topic, partition,
                                 self._tails.get(self.layout.topic_table(topic), topic.topic_id),
                                 keep=sub.message_filter(), count_filtered=self.metrics.filtered.labels(sub.name).inc)
        pipeline = PartitionPipeline(
            sub, partition, start, source=source, sender=self._sender, endpoint=self._endpoint(sub),
            offsets=self.offsets, dead_letters=self.dead_letters, metrics=self.metrics,
            poll_s=self.settings.delivery_poll_ms / 1000,
            lease_left=lambda: self._lease_left(pair), fence=fence,
            on_gone=lambda reason: self._on_gone(sub.name, reason), commits=self._commits,
            read_ahead_bytes=self.settings.delivery_read_ahead_bytes, budget=self._read_ahead,
        )
        task = asyncio.create_task(pipeline.run(), name=f"deliver-{sub.name}-{partition}")
        self._running[pair] = _Running(pipeline, task, _config(sub), sub.seek_epoch)

    async def _start_offset(self, sub: Subscription, topic: TopicConfig, partition: int, lease: Lease, fence: Fence,
                            committed: int | None) -> int:
        if lease.seek_epoch < sub.seek_epoch and sub.seek_offsets and partition in sub.seek_offsets:
            target = sub.seek_offsets[partition]
            await asyncio.to_thread(self.offsets.commit, sub.name, sub.topic, {partition: target}, OffsetReason.SEEK,
                                    fence=fence)
            return target
        if committed is not None:
            return committed
        if sub.seek_offsets and partition in sub.seek_offsets:
            # The create has not committed its START offsets yet, or crashed first: its row holds them.
            target = sub.seek_offsets[partition]
            await asyncio.to_thread(self.offsets.commit, sub.name, sub.topic, {partition: target}, OffsetReason.START)
            return target
        # A partition added after the subscription began: start at its beginning.
        source = PartitionSource(self.layout, topic, partition)
        return await asyncio.to_thread(lambda: source.log_start(source.committed_end()))

    async def _stop(self, pairs: set[Pair], *, commit: bool) -> None:
        """Stop the pipelines of `pairs` together and, with `commit`, commit what they delivered in
        one Delta commit: a rebalance that hands over many partitions costs one commit, not one each."""
        stopping = [(pair, running) for pair in sorted(pairs) if (running := self._running.pop(pair, None))]
        if not stopping:
            return
        for pair, running in stopping:
            running.task.cancel()
            for replays in (self._replays, self._matching):
                replay = replays.pop(pair, None)
                if replay is not None:
                    replay.cancel()
        await asyncio.gather(*(r.task for _, r in stopping), return_exceptions=True)
        async with self._commit_lock:
            for _, running in stopping:
                await running.pipeline.stop()
            if commit:
                try:
                    await self._commit([r.pipeline for _, r in stopping])
                except Exception:
                    log.exception("could not commit offsets of %s on stop", ", ".join(f"{n} partition {p}"
                                                                                   for (n, p), _ in stopping))

    # -- offsets and replays, batched over every pipeline ---------------------------------
    async def _commit_loop(self) -> None:
        interval = self.settings.offset_commit_interval_ms / 1000
        last_replay_check = 0.0
        while True:
            await asyncio.sleep(interval)
            try:
                await self.commit_all()
                if time.monotonic() - last_replay_check >= max(1.0, interval):
                    last_replay_check = time.monotonic()
                    await self._start_replays()
            except Exception:
                log.exception("delivery worker %s: offset commit failed; retrying", self.worker_id)

    async def commit_all(self) -> None:
        async with self._commit_lock:
            await self._commit([r.pipeline for r in self._running.values()])

    async def _commit(self, pipelines: list[PartitionPipeline]) -> None:
        """Dead letters first, then every changed position, in two Delta commits (under the lock)."""
        taken = [(p, *p.to_commit()) for p in pipelines]
        letters = [letter for _, _, batch in taken for letter in batch]
        try:
            await asyncio.to_thread(self.dead_letters.add, letters)
        except Exception:
            for pipeline, _, batch in taken:
                pipeline.give_back(batch)
            raise
        moved = [(p, pos) for p, pos, _ in taken if pos is not None]
        await asyncio.to_thread(self.offsets.commit_many,
                                [Position(p.sub.name, p.sub.topic, p.partition, pos, p.fence) for p, pos in moved],
                                OffsetReason.ACK)
        for pipeline, pos in moved:
            pipeline.committed(pos)

    async def _start_replays(self) -> None:
        """Start the replays asked for on the partitions this worker runs: of dead letters, and by
        predicate; one of each kind at a time per partition."""
        groups = {name for name, _ in self._running}
        for pair, offsets in (await asyncio.to_thread(self.dead_letters.pending_replays_all, groups)).items():
            if (pipeline := self._free_for(self._replays, pair)) is not None:
                self._replays[pair] = asyncio.create_task(self._replay(
                    pipeline, "a replay of dead letters", functools.partial(pipeline.replay, offsets)))
        running = await asyncio.to_thread(self.replays.running, groups)
        for pair, part in running.items():
            if (pipeline := self._free_for(self._matching, pair)) is not None:
                matching = functools.partial(pipeline.replay_matching, part, self.replays)
                self._matching[pair] = asyncio.create_task(self._replay(pipeline, f"replay {part.replay_id}", matching,
                                                                        part))
        parts = {(p.replay_id, p.partition, p.next_offset) for p in running.values()}
        self._replay_failing = {k: v for k, v in self._replay_failing.items() if k in parts}

    def _free_for(self, replays: dict[Pair, asyncio.Task[None]], pair: Pair) -> PartitionPipeline | None:
        """The pair's pipeline, if this worker runs it and no replay of that kind runs on it."""
        running = self._running.get(pair)
        busy = replays.get(pair)
        return running.pipeline if running is not None and (busy is None or busy.done()) else None

    async def _replay(self, pipeline: PartitionPipeline, what: str, replay: Callable[[], Awaitable[None]],
                      part: ReplayPart | None = None) -> None:
        """Run `replay`; a failure is retried at the next check, and a replay by predicate (`part`)
        that has failed for REPLAY_GIVE_UP_S with no progress recorded fails with its error, rather
        than stay `running` with none shown (a table it cannot read, say)."""
        key = None if part is None else (part.replay_id, part.partition, part.next_offset)
        try:
            await replay()
        except Gone as exc:
            self._on_gone(pipeline.sub.name, str(exc))
        except Exception as exc:
            log.exception("%s of %s partition %d failed; it goes on at the next check", what, pipeline.sub.name,
                          pipeline.partition)
            if key is not None:
                first = self._replay_failing.setdefault(key, time.monotonic())
                if time.monotonic() - first >= REPLAY_GIVE_UP_S:
                    del self._replay_failing[key]
                    await asyncio.to_thread(self.replays.fail, key[0], f"failing for {REPLAY_GIVE_UP_S:,.0f} s in "
                                            f"partition {key[1]} at offset {key[2]}: {type(exc).__name__}: {exc}")
        else:
            if key is not None:
                self._replay_failing.pop(key, None)

    def _lease_left(self, pair: Pair) -> float:
        """Seconds this worker may still send and commit for `pair` (<= 0: not at all). It stops a
        little before the lease ends, so a successor never overlaps it."""
        lease = self._held.get(pair)
        if lease is None:
            return 0.0
        margin = timedelta(seconds=min(2.0, self.settings.lease_ttl_s / 4))
        return (lease.expires_at - margin - datetime.now(UTC)).total_seconds()

    def _on_gone(self, name: str, reason: str) -> None:
        self._to_disable[name] = reason

    async def _disable(self, subs: dict[str, Subscription]) -> None:
        for name, reason in list(self._to_disable.items()):
            if name in subs and subs[name].disabled_reason is None:
                log.warning("disabling subscription %s: %s", name, reason)
                subs[name] = await asyncio.to_thread(self.subscriptions.update, name, disabled_reason=reason)
                if self._operational is not None:
                    self._operational.disabled(subs[name], reason, subs[name].failing_since)
            del self._to_disable[name]

    async def _record_health(self, subs: dict[str, Subscription]) -> None:
        """Keep each subscription's `failing_since` with this worker's circuit (set when it opens,
        cleared when it closes), and disable one whose endpoint has failed for `disable_after_ms`."""
        now = datetime.now(UTC)
        for name, (_, endpoint) in self._endpoints.items():
            sub = subs.get(name)
            if (sub is not None and sub.failing_since is not None and name not in self._circuits
                    and endpoint.answered_at > sub.failing_since.timestamp()):
                # Failing since a circuit that opened elsewhere (a worker since gone): the endpoint
                # has answered this worker since then, so it is failing no longer.
                self._circuits[name] = BreakerState.CLOSED
        for name, state in list(self._circuits.items()):
            sub = subs.get(name)
            if sub is None:
                del self._circuits[name]
                continue
            failing = state is not BreakerState.CLOSED
            changes: dict[str, Any] = {}
            if failing and sub.failing_since is None:
                changes["failing_since"] = now
            elif not failing:
                del self._circuits[name]
                if sub.failing_since is not None:
                    changes["failing_since"] = None
            if changes:
                subs[name] = await asyncio.to_thread(self.subscriptions.update, name, **changes)
                if self._operational is not None and not failing and sub.failing_since is not None:
                    self._operational.recovered(subs[name], sub.failing_since)
            since = subs[name].failing_since
            if (since is not None and sub.disable_after_ms
                    and (now - since).total_seconds() * 1000 >= sub.disable_after_ms):
                self._to_disable.setdefault(name, f"no delivery succeeded for {sub.disable_after_ms / 1000:,.0f} s "
                                                  f"(failing since {since.isoformat(timespec='seconds')})")

    # -- status -------------------------------------------------------------------------
    def status(self, name: str) -> dict[int, PipelineStatus]:
        return {p: r.pipeline.status for (n, p), r in self._running.items() if n == name}

    def owned(self) -> list[Pair]:
        return sorted(self._running)

    def describe(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "partitions": [list(p) for p in self.owned()]}
