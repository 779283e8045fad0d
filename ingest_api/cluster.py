"""This node's part in a cluster: its id, its heartbeat, and the partitions it takes and hands over.

Nodes that share a table root are a cluster (tables/ownership.py holds who owns what). Every
`ingest_heartbeat_s` this node reads the topics (a topic created, changed or deleted through any
node shows here within a heartbeat, also while a beat is busy claiming), heartbeats into the
ownership table, and then:

- claims the partitions the heartbeat gave it in their topic tables (tables/fencing.py) and only
  then opens them to produce (its ownership part, ownership.py, which it builds and drives).
  Claims run beside the heartbeats, on a thread of their own: on a loaded machine they can take
  longer than a lease lives, and the leases they claim for must be renewed meanwhile;
- hands over the partitions the plan gives to another node: closed to produce, flushed, released;
- drops the partitions whose lease it lost (its heartbeat came too late): another node may have
  claimed them already, and the table refuses this node's commits to them anyway.

One node with no peers is a cluster of one: it owns every partition, and the only cost is a
heartbeat commit every half TTL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from lakebroker.ingest_api.clock_watch import ClockWatch
from lakebroker.ingest_api.dedup_rebuild import placed_by_others
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.node_identity import advertised_url, node_id
from lakebroker.ingest_api.ownership import Ownership
from lakebroker.ingest_api.reader import unreadable
from lakebroker.ingest_api.sequences import SequenceMarks
from lakebroker.tables import fencing
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.layout import Layout
from lakebroker.tables.ownership import ClusterView, Heartbeat, OwnershipTable, Pair
from lakebroker.tables.partition_claims import claim_partitions
from lakebroker.tables.settings import Settings
from lakebroker.tables.storage_clock import skew
from lakebroker.tables.topics import TopicConfig, TopicGone, TopicStore

log = logging.getLogger(__name__)
SLOW_S = 2.0  # a claim or a learning of ids that takes longer is logged: it keeps partitions closed
SLOW_BEAT_SHARE = 0.25  # of the lease TTL: a heartbeat that takes longer is logged
# Threads of the lease's table work, the clock probe and the claims (topics claimed at once: each
# claim is a table load and a commit, mostly waiting on storage).
THREADS = {"lease": 1, "clock": 1, "claim": 4}
EXPIRY_MARGIN_S = 0.05  # past another node's lease end before the beat that takes its partitions
_T = TypeVar("_T")


def _named(pairs: frozenset[Pair], epochs: Mapping[Pair, int], topics: Mapping[str, TopicConfig]) -> str:
    """`orders[0, 3] at epochs 4, 2; events[1] at epoch 7`, for the log."""
    names = {t.topic_id: name for name, t in topics.items()}
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic_id, partition in pairs:
        by_topic[topic_id].append(partition)
    parts = []
    for topic_id, partitions in sorted(by_topic.items(), key=lambda item: names.get(item[0], item[0])):
        partitions.sort()
        at = ", ".join(str(epochs[(topic_id, p)]) for p in partitions)
        parts.append(f"{names.get(topic_id, topic_id)}{partitions} at epoch{'s' if len(partitions) > 1 else ''} {at}")
    return "; ".join(parts)


class Membership:
    def __init__(self, settings: Settings, *, store: TopicStore, topics: Callable[[], Mapping[str, TopicConfig]],
                 follow_topics: Callable[[], Awaitable[bool]], marks: SequenceMarks, metrics: IngestMetrics,
                 ownership: Callable[[Membership], Ownership]) -> None:
        """`topics`: the topics this node knows; `follow_topics`: takes in other nodes' topic changes,
        whether any; `ownership`: builds the part whose partitions these leases open and close."""
        self.layout = Layout.of(settings)
        self.node = node_id(self.layout)
        self.heartbeat_s = settings.ingest_heartbeat_s
        self.dedup_window_s = settings.dedup_window_s
        self._store = store
        self._topics = topics
        self._follow_topics_now = follow_topics
        self._marks = marks
        self.table = OwnershipTable(self.layout, self.node, advertised_url(settings), settings.ingest_lease_ttl_s,
                                    live_topics=store.topic_ids)
        self.view: ClusterView | None = None
        self._released: set[Pair] = set()  # handed over and flushed: released at the next heartbeat
        self._handing_over: set[Pair] = set()
        self._wake = asyncio.Event()
        self._beat_lock = asyncio.Lock()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._follower: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # hand-overs in progress
        self._asked: set[asyncio.Task[None]] = set()  # beats topic changes asked for (beat_for)
        self._draining = False
        self._held: dict[Pair, int] = {}  # the leases this node held at its last heartbeat, with their epochs
        self._opening: set[Pair] = set()  # claimed, their ids being learnt before they open (`_open`)
        self._openings: set[asyncio.Task[None]] = set()
        self.clock = ClockWatch(lambda: self._on_thread("clock", skew, self.layout.system_root, self.node),
                                settings.ingest_lease_ttl_s, metrics, self._wake.set)
        self.ownership = ownership(self)
        self._claiming: set[Pair] = set()  # taken by a heartbeat, their claim under way
        self._claims: set[asyncio.Task[None]] = set()  # claims running beside the loop's beats
        self._slow_beat_said: float | None = None  # when a slow heartbeat was last logged
        self._expiry_beat: asyncio.TimerHandle | None = None  # a beat at another node's lease end
        # The lease's table work and the claims each run on a thread of their own: in the shared
        # pool the heartbeat would queue behind slow reads and commits, and behind a claim racing
        # flushes, and a loaded node would lose leases it is alive to renew.
        self._threads: dict[str, concurrent.futures.ThreadPoolExecutor] = {}

    async def _on_thread(self, name: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        pool = self._threads.get(name)
        if pool is None:
            pool = concurrent.futures.ThreadPoolExecutor(THREADS[name], thread_name_prefix=f"lakebroker-{name}")
            self._threads[name] = pool
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args, **kwargs))

    async def _on_lease_thread(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await self._on_thread("lease", fn, *args, **kwargs)

    def own_url(self) -> str:
        return self.table.url

    def advertise(self, url: str) -> None:
        """The URL others reach this node at, once `serve` knows its port."""
        self.table.url = url.rstrip("/")
        self._wake.set()

    def advertise_kafka(self, address: str) -> None:
        """The host:port Kafka clients reach this node's listener at, in the node's row for every
        node's Metadata answers. Written with the row's next renewal (within half a lease TTL), not
        in a commit of its own: the ownership table's commits are what every heartbeat contends for."""
        self.table.kafka = address

    async def join(self) -> None:
        """The first heartbeat takes this node's share; the beats go on from there, and this returns
        once the share is claimed and open (the node serves then)."""
        began = time.monotonic()
        async with self._beat_lock:
            taken = await self._beat()
        self._task = asyncio.create_task(self._run())
        self._follower = asyncio.create_task(self._follow_topics())
        if taken:
            await self._claim(taken, wait=True)
        log.info("joined the cluster as node %s: %d partitions taken, claimed and opened in %.1f s", self.node,
                 len(self.ownership.owned_pairs()), time.monotonic() - began)

    async def stop_beating(self) -> None:
        """End the heartbeat loop, after the beat in progress: at shutdown nothing is taken any more
        (the leases stay until `leave` or their TTL)."""
        self._closing = True
        self._wake.set()
        if self._expiry_beat is not None:
            self._expiry_beat.cancel()
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        if self._task is not None:
            await self._task
            self._task = None
        await self.clock.stop()
        for claim in list(self._claims):  # a claim is never cut off half done; it opens nothing now
            with contextlib.suppress(Exception):
                await claim
        for opening in list(self._openings):  # nothing opens once the node stops
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opening
        for task in list(self._asked):  # a beat a topic change left running
            with contextlib.suppress(Exception):
                await task

    async def leave(self) -> None:
        """Stop heartbeating and release every lease (the broker has flushed what it holds)."""
        await self.stop_beating()
        with contextlib.suppress(LakebrokerError, OSError):
            await self._on_lease_thread(self.table.heartbeat, self._pairs(), leave=True)
        for pool in self._threads.values():
            pool.shutdown(wait=False)
        self._threads.clear()

    def wake(self) -> None:
        """Beat now (a topic was created or deleted through this node)."""
        self._wake.set()

    def drain(self) -> None:
        """The node is stopping: from its next beat on it takes no partition and starts no
        hand-over, and every node's plan gives its partitions to the others (tables/ownership.py);
        those it holds stay its own until it stops."""
        self._draining = True
        self._wake.set()

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat_s):
                    await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            try:
                await self.beat(wait=False)
            except Exception:  # the next heartbeat tries again; the lease outlives a few misses
                log.exception("cluster heartbeat failed")

    async def _follow_topics(self) -> None:
        """Topic changes every heartbeat, beside the beats: a beat that claims many partitions (a
        node just started, or taking a dead node's share) can take seconds, and a topic deleted or
        re-created elsewhere must not stay served here meanwhile. A change wakes the beat, which
        gives new partitions their owners."""
        while not self._closing:
            await asyncio.sleep(self.heartbeat_s)
            try:
                if await self._follow_topics_now():
                    self._wake.set()
            except Exception:  # the next round reads again
                log.exception("reading the topics failed")

    def _note_slow_beat(self, took: float) -> None:
        """A heartbeat that takes a good part of the TTL leaves the lease little margin: one more slow
        beat and the node's partitions move. Said once a minute at most, with the remedy."""
        ttl = self.table.ttl.total_seconds()
        said = self._slow_beat_said
        if took <= ttl * SLOW_BEAT_SHARE or (said is not None and time.monotonic() - said < 60):
            return
        self._slow_beat_said = time.monotonic()
        log.warning("a heartbeat took %.1f s, over a quarter of the %.0f s lease TTL: the table storage answers "
                    "too slowly for this TTL, and the node's leases may run out between two beats; raise "
                    "LAKEBROKER_INGEST_LEASE_TTL_S", took, ttl)

    def _beat_at_next_expiry(self) -> None:
        """Wake the loop's beat when the first lease another node holds runs out: a dead node's
        partitions are taken then, not up to a heartbeat (and a beat's own time) later. A live node
        renews its leases before then, and the beats before it move the wake-up on."""
        if self._expiry_beat is not None:
            self._expiry_beat.cancel()
            self._expiry_beat = None
        expiry = None if self.view is None or self.clock.off else self.view.next_expiry(self.node)
        if expiry is not None:
            wait = (expiry - self.table.now()).total_seconds() + EXPIRY_MARGIN_S
            self._expiry_beat = asyncio.get_running_loop().call_later(max(0.0, wait), self._wake.set)

    def _pairs(self) -> dict[Pair, str]:
        return {(t.topic_id, p): t.name for t in self._topics().values() for p in range(t.partitions)}

    async def beat(self, *, wait: bool = True) -> None:
        """One heartbeat, then the claims of the partitions it took. `wait` (a topic's creation):
        topic changes are taken in first, and this returns once every partition this node holds is
        claimed and open. The loop's beats claim beside the next beats, which renew the leases
        meanwhile, however long the claims take."""
        if wait:  # the loop's beats leave this to `_follow_topics`: a topic change can wait for a commit
            await self._follow_topics_now()
        async with self._beat_lock:  # the loop's beats and those a topic's creation asks for
            taken = await self._beat()
        if not wait:
            if taken:
                self._claims.add(task := asyncio.create_task(self._claim(taken, wait=False)))
                task.add_done_callback(self._claimed)
            return
        if taken:
            await self._claim(taken, wait=True)
        # And those the loop's beats are claiming: at the answer, what this node holds is open. A
        # claim opens its partitions in a task it starts when it ends, hence the loop.
        while pending := self._claims | self._openings:
            await asyncio.wait(pending)

    def _claimed(self, task: asyncio.Task[None]) -> None:
        self._claims.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("claiming partitions failed (%s); the next heartbeat claims them again", exc, exc_info=exc)

    async def beat_for(self, timeout_s: float) -> bool:
        """A beat now, as a new topic or new partitions ask for it, waited for `timeout_s` at most:
        then it goes on by itself (a claim is never cut off half done), and the producers of
        partitions still without an owner get 503 and retry. Whether it finished in time."""
        task = asyncio.create_task(self.beat())
        self._asked.add(task)
        task.add_done_callback(self._asked_done)
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            log.warning("a heartbeat is taking over %.0f s; the new partitions get owners when it ends", timeout_s)
            return False
        return True

    def _asked_done(self, task: asyncio.Task[None]) -> None:
        self._asked.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("a heartbeat a topic change asked for failed (%s); the next one takes its place", exc)

    async def _beat(self) -> dict[Pair, int]:
        """The heartbeat and what it tells: leases lost, hand-overs to start. The partitions it
        took, with their epochs, for the caller to claim."""
        await self.clock.look()
        release = frozenset(self._released)
        began = time.monotonic()
        beat: Heartbeat = await self._on_lease_thread(self.table.heartbeat, self._pairs(), release,
                                                      draining=self._draining or self.clock.off)
        self._note_slow_beat(time.monotonic() - began)
        self._released -= release
        # Routing judges the others' leases: by the storage's time when this clock is known to be off.
        self.view = dataclasses.replace(beat.view, at=beat.view.at - self.clock.skew) if self.clock.off else beat.view
        self._beat_at_next_expiry()
        if beat.taken:
            log.info("took %s", _named(beat.taken, beat.held, self._topics()))
        owned = self.ownership.owned_pairs()
        lost = owned - beat.held.keys()
        if lost:
            log.warning("lost the lease of %d partitions; another node takes them", len(lost))
            self.ownership.disown(lost)
        if self._draining:  # it holds what it holds until it stops: broker.stop commits and releases it
            return {}
        self._held = beat.held
        for pair in beat.give_up - self._handing_over:
            self._handing_over.add(pair)
            self._tasks.add(task := asyncio.create_task(self._hand_over(pair)))
            task.add_done_callback(self._tasks.discard)
        if self.clock.off:
            return {}
        busy = owned | self._opening | self._claiming
        return {pair: epoch for pair, epoch in beat.held.items() if pair not in busy}

    async def _claim(self, taken: dict[Pair, int], *, wait: bool) -> None:
        """Claim `taken`, the topics at once, then open the claimed partitions: before this returns
        if `wait`, else beside the beats."""
        self._claiming |= taken.keys()
        by_topic: dict[str, dict[int, int]] = defaultdict(dict)
        for (topic_id, partition), epoch in taken.items():
            by_topic[topic_id][partition] = epoch
        topics = {t.topic_id: t for t in self._topics().values()}

        async def one(topic_id: str, epochs: dict[int, int]) -> None:
            try:
                topic = topics.get(topic_id)
                if topic is not None and not self._closing:  # else deleted since the heartbeat, or stopping
                    await self._claim_topic(topic, epochs, wait)
            finally:
                self._claiming -= {(topic_id, p) for p in epochs}

        try:
            await asyncio.gather(*(one(topic_id, epochs) for topic_id, epochs in by_topic.items()))
        finally:
            self._claiming -= taken.keys()

    async def _claim_topic(self, topic: TopicConfig, epochs: dict[int, int], wait: bool) -> None:
        topic_id = topic.topic_id
        began = time.monotonic()
        try:
            ends, snapshot = await self._on_thread("claim", claim_partitions, self._store, topic, epochs,
                                                    node=self.node)
        except TopicGone:
            return  # deleted through another node: this node forgets it as it follows the delete
        except fencing.Deposed as exc:
            # The table holds a newer epoch than our lease: a newer owner claimed first, or the
            # ownership table was reset. Lift our lease above it; the next heartbeat claims again.
            log.warning("%s: partitions %s hold newer epochs in the table", topic.name, sorted(exc.partitions))
            for p, newer in exc.newer.items():
                await self._on_lease_thread(self.table.raise_epoch, (topic_id, p), newer + 1)
            self._wake.set()
            return
        except CommitFailedError as exc:  # claims kept racing other commits: the next heartbeat claims again
            log.warning("claiming partitions of %r: %s; trying again at the next heartbeat", topic.name, exc)
            return
        except DeltaError as exc:  # a damaged log: this topic waits, the others go on
            reason = unreadable(self.layout, topic, exc).message
            if self.ownership.unreadable.get(topic_id) != reason:
                log.error("%s", reason)
            self.ownership.unreadable[topic_id] = reason
            return
        if (took := time.monotonic() - began) > SLOW_S:
            log.warning("topic %r: claiming partitions %s took %.1f s", topic.name, sorted(epochs), took)
        unread = self.ownership.unreadable.pop(topic_id, None) is not None
        if unread:
            log.warning("topic %r: its table reads again; its partitions are open", topic.name)
        claimed = {p: (epochs[p], end, prev) for p, (end, prev) in ends.items()}
        if wait:  # a start or a topic's creation: open before the answer
            await self._open(topic, claimed, unread, snapshot)
            return
        # The learning runs beside the beats and the other topics' claims (it can take seconds).
        pairs = {(topic_id, p) for p in claimed}
        self._opening |= pairs
        task = asyncio.create_task(self._open(topic, claimed, unread, snapshot, claimed_from=began))
        self._openings.add(task)
        task.add_done_callback(functools.partial(self._opened, pairs))

    async def _open(self, topic: TopicConfig, claimed: dict[int, tuple[int, int, int | None]], unread: bool,
                    snapshot: DeltaTable | None = None, *, claimed_from: float | None = None) -> None:
        """Open claimed partitions (partition -> (epoch, claimed end, this node's end before)) once the
        ids other nodes committed to them since this node's own last commit are learnt: a retry of one
        of them must get its first answer here. A table unreadable at start was never read for ids:
        all of it within the window. Those whose lease this node lost meanwhile stay closed.
        `snapshot`: the table as the claim left it, which holds every row below the claimed ends.
        `claimed_from`: when the claim began (monotonic), for the log line of a claim beside the beats."""
        tid = bytes.fromhex(topic.topic_id)
        others = {p: (0 if unread else self.ownership.own_end((tid, p), prev), end)
                  for p, (_, end, prev) in claimed.items()}
        began = time.monotonic()
        placed = await asyncio.to_thread(placed_by_others, self.layout, topic, others, window_s=self.dedup_window_s,
                                         marks=self._marks, table=snapshot)
        if (took := time.monotonic() - began) > SLOW_S:
            log.warning("topic %r: learning the %d ids other nodes committed to partitions %s took %.1f s",
                        topic.name, placed.num_rows, sorted(claimed), took)
        await self.ownership.learn_ids(placed)
        await self.ownership.learn_handed_ids(topic, claimed)
        current = self._topics().get(topic.name)
        if current is None or current.topic_id != topic.topic_id:
            return  # deleted (or made again) meanwhile
        held = {p: c for p, c in claimed.items() if self._held.get((topic.topic_id, p)) == c[0]}
        if held:
            self.ownership.adopt(current, held, placed)
            if claimed_from is not None:
                log.info("topic %r: partitions %s open, %.1f s after their claim began", topic.name, sorted(held),
                         time.monotonic() - claimed_from)

    def _opened(self, pairs: set[Pair], task: asyncio.Task[None]) -> None:
        self._opening -= pairs
        self._openings.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("opening partitions this node claimed failed (%s); the next heartbeat claims them again",
                      exc, exc_info=exc)
            self._wake.set()

    async def _hand_over(self, pair: Pair) -> None:
        """Close the partition to produce, commit what it holds, then release it at the next beat."""
        try:
            if await self.ownership.hand_over(pair):
                self._released.add(pair)
                self._wake.set()
        finally:
            self._handing_over.discard(pair)

    def owner_url(self, pair: Pair) -> str | None:
        if self.view is None:
            return None
        owner = self.view.owner_of(pair)
        return None if owner is None else owner.url
