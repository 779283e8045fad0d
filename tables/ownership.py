"""Which ingest node owns which topic partition: the `_system/partition_owners` state table.

A cluster is the nodes that share a table root; there is no list of peers. Each node heartbeats
into this table (a StateTable: a compare-and-swap on its version) with its id and advertised URL,
and holds its partitions' leases through the same row: a lease lives while its owner's heartbeat
does. From the live nodes and the topics, every node computes the same balanced plan
(`balance`), takes the free partitions the plan gives it, and lets go of those it gives to others.

A node that is stopping drains: its row's epoch becomes DRAINING, and from then on no plan gives
it a partition, while the leases it holds stay its own until it releases them. So its partitions
and the messages it still keeps for other nodes go to nodes that stay, and it takes nothing back
meanwhile (a stopping node that claimed partitions again deposed the nodes taking them over).

Taking a partition bumps its epoch. A lease alone does not make a node the only writer (clocks
skew, processes pause): the new owner claims the epoch in the topic table before it accepts a
message (tables/fencing.py), and that claim is what refuses the old owner's late commits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import OWNERS_SCHEMA, OWNERS_SCHEMA_VERSION
from lakebroker.tables.state_table import Rows, StateTable

Pair = tuple[str, int]  # (topic id, partition)
FORGET_NODES_AFTER_TTLS = 10  # a node row this many TTLs past its expiry is dropped from the table
DRAINING = -1  # a node row's epoch while the node stops (0 otherwise): planned no partitions
# The expiry a release writes: past on every clock, so a node whose clock runs ahead lets go at once.
RELEASED = datetime(1970, 1, 1, tzinfo=UTC)
_LONG_AGO = datetime.min.replace(tzinfo=UTC)  # a pair whose owner took it at no known time


@dataclass(frozen=True)
class NodeInfo:
    node: str
    url: str
    since: datetime
    expires_at: datetime
    draining: bool = False
    kafka: str | None = None  # its Kafka listener's advertised host:port

    def alive(self, now: datetime) -> bool:
        return self.expires_at > now


@dataclass(frozen=True)
class Owner:
    topic_id: str
    topic: str
    partition: int
    node: str | None  # the owner; once its lease ran out or it released it, the owner it had last
    epoch: int
    since: datetime
    expires_at: datetime

    def live(self, now: datetime) -> bool:
        return self.node is not None and self.expires_at > now


@dataclass(frozen=True)
class ClusterView:
    """The table as one read saw it."""

    at: datetime
    nodes: tuple[NodeInfo, ...]
    owners: Mapping[Pair, Owner]
    pins: Mapping[Pair, str] = field(default_factory=dict)  # pair -> the node `lakebroker cluster move` chose

    def live_nodes(self) -> dict[str, NodeInfo]:
        return {n.node: n for n in self.nodes if n.alive(self.at)}

    def next_expiry(self, node: str) -> datetime | None:
        """When the first lease another node holds now runs out (None: it holds none)."""
        return min((o.expires_at for o in self.owners.values() if o.node != node and o.live(self.at)), default=None)

    def owner_of(self, pair: Pair) -> NodeInfo | None:
        """The live node that holds `pair`'s lease, if any."""
        owner = self.owners.get(pair)
        if owner is None or not owner.live(self.at):
            return None
        return self.live_nodes().get(owner.node or "")


@dataclass(frozen=True)
class Heartbeat:
    """What one heartbeat left this node with."""

    held: dict[Pair, int]  # pair -> epoch, every lease this node holds now
    taken: frozenset[Pair]  # the pairs among them it took in this heartbeat (a new epoch each)
    give_up: frozenset[Pair]  # held pairs the plan gives to another node: drain, then release
    view: ClusterView = field(repr=False)


def balance(pairs: Sequence[Pair], nodes: Sequence[str], owners: Mapping[Pair, str],
            pins: Mapping[Pair, str] | None = None, since: Mapping[Pair, datetime] | None = None) -> dict[Pair, str]:
    """The plan: each node gets len(pairs) // len(nodes) pairs or one more. A pair stays with its
    current owner while that owner is within its share, so a node joining or dying moves only the
    pairs it must. An owner over its share keeps the pairs it took last (`since`: when each owner
    took its pair) and gives up those it has held longest: a pair just taken may not be open yet,
    and moving it again would close it through a second claim. A pair pinned to a live node
    (`lakebroker cluster move`) goes there, and the rest are shared as before. The same inputs give
    the same plan on every node."""
    if not nodes:
        return {}
    ordered = sorted(set(nodes))
    pinned = {pair: node for pair, node in (pins or {}).items() if node in ordered and pair in set(pairs)}
    if pinned:
        rest = balance([p for p in pairs if p not in pinned], ordered, owners, since=since)
        return {**rest, **pinned}
    base, extra = divmod(len(pairs), len(ordered))
    load = Counter(owner for pair, owner in owners.items() if owner in ordered and pair in set(pairs))
    # The extra pairs go to the nodes that hold the most already: fewer moves.
    by_load = sorted(ordered, key=lambda n: (-load[n], n))
    quota = {n: base + (1 if i < extra else 0) for i, n in enumerate(by_load)}
    plan: dict[Pair, str] = {}
    count: Counter[str] = Counter()
    unplaced: list[Pair] = []
    taken_at = since or {}
    # Newest holdings first (a stable sort: pairs of one age stay in order).
    for pair in sorted(sorted(pairs), key=lambda p: taken_at.get(p, _LONG_AGO), reverse=True):
        owner = owners.get(pair)
        if owner in quota and count[owner] < quota[owner]:
            plan[pair] = owner
            count[owner] += 1
        else:
            unplaced.append(pair)
    unplaced.sort()
    turn = 0
    for pair in unplaced:  # round-robin over the nodes with room, so a topic spreads over them
        while count[ordered[turn % len(ordered)]] >= quota[ordered[turn % len(ordered)]]:
            turn += 1
        plan[pair] = ordered[turn % len(ordered)]
        count[plan[pair]] += 1
        turn += 1
    return plan


def _node(row: dict[str, Any]) -> NodeInfo:
    return NodeInfo(row["node"], row["url"] or "", row["since"], row["expires_at"], row["epoch"] == DRAINING,
                    row.get("kafka"))


def _owner(row: dict[str, Any]) -> Owner:
    return Owner(row["topic_id"], row["topic"], row["partition"], row["node"], row["epoch"], row["since"],
                 row["expires_at"])


def _view(rows: Rows, now: datetime) -> ClusterView:
    nodes = tuple(sorted((_node(r) for r in rows if r["kind"] == "node"), key=lambda n: n.node))
    owners = {(r["topic_id"], r["partition"]): _owner(r) for r in rows if r["kind"] == "partition"}
    pins = {(r["topic_id"], r["partition"]): r["node"] for r in rows if r["kind"] == "pin"}
    return ClusterView(now, nodes, owners, pins)


class OwnershipTable:
    def __init__(self, layout: Layout, node: str, url: str, ttl_s: float,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 live_topics: Callable[[], Collection[str]] | None = None) -> None:
        """`live_topics`: the ids of the topics the topic store has (TopicStore.topic_ids); the heartbeat
        keeps the table to them. None: every topic a heartbeat is given is live (this table's own tests)."""
        self.table = StateTable(layout.owners_table, OWNERS_SCHEMA, OWNERS_SCHEMA_VERSION)
        self.node = node
        self.url = url
        self.kafka: str | None = None  # the Kafka listener's advertised host:port, once it listens
        self.ttl = timedelta(seconds=ttl_s)
        self._clock = clock
        self._live_topics = live_topics

    def view(self) -> ClusterView:
        return _view(self.table.read(), self._clock())

    def now(self) -> datetime:
        """The time leases are judged by (this node's clock)."""
        return self._clock()

    def heartbeat(self, pairs: Mapping[Pair, str], release: frozenset[Pair] = frozenset(), *,
                  leave: bool = False, draining: bool = False) -> Heartbeat:
        """Renew this node and its leases, release `release` (drained by the caller), and take the
        free pairs of `pairs` (pair -> topic name: the topics as this node knows them) that the plan
        gives this node, in one commit. `leave` releases everything and ends the node's heartbeat;
        `draining` marks the node as stopping (DRAINING), so that no plan gives it a pair."""
        state = DRAINING if draining else 0

        def change(rows: Rows) -> tuple[Rows, Heartbeat]:
            now = self._clock()
            expires = RELEASED if leave else now + self.ttl
            # Read after the rows, in every attempt: a topic deleted before this commit's snapshot is
            # gone here too, so a node that has not seen the delete writes back none of the rows it
            # removed, and rows of a deleted topic (written before, or a pin) leave with this commit.
            ids = None if self._live_topics is None else self._live_topics()
            out = [dict(r) for r in rows if ids is None or r["kind"] == "node" or r["topic_id"] in ids]
            serving = {pair: topic for pair, topic in pairs.items() if ids is None or pair[0] in ids}
            nodes = [r for r in out if r["kind"] == "node"
                     and r["expires_at"] > now - self.ttl * FORGET_NODES_AFTER_TTLS]
            me = next((r for r in nodes if r["node"] == self.node), None)
            if me is None:
                me = {"kind": "node", "node": self.node, "url": self.url, "kafka": self.kafka, "topic_id": "",
                      "topic": "", "partition": -1, "epoch": state, "since": now, "expires_at": expires}
                nodes.append(me)
            elif leave or me["url"] != self.url or me["epoch"] != state or me["expires_at"] - now < self.ttl / 2:
                # Renewed at half its life: a heartbeat that changes nothing else commits nothing. The
                # Kafka address rides along (within half a TTL of the listener's start): no commit of its own.
                me.update(url=self.url, kafka=self.kafka or me.get("kafka"), epoch=state, expires_at=expires)
            live = sorted(r["node"] for r in nodes if r["expires_at"] > now and r["epoch"] != DRAINING)
            by_pair = {(r["topic_id"], r["partition"]): r for r in out if r["kind"] == "partition"}
            owned = {pair: r for pair, r in by_pair.items() if r["node"] and r["expires_at"] > now}
            owners = {pair: r["node"] for pair, r in owned.items()}
            pins = [r for r in out if r["kind"] == "pin"]
            plan = balance(list(serving), live, owners, {(r["topic_id"], r["partition"]): r["node"] for r in pins},
                           since={pair: r["since"] for pair, r in owned.items()})
            held: dict[Pair, int] = {}
            taken: set[Pair] = set()
            give_up: set[Pair] = set()
            for pair, topic in serving.items():
                row = by_pair.get(pair)
                mine = row is not None and row["node"] == self.node and row["expires_at"] > now
                if row is not None and mine:
                    if leave or pair in release:
                        row.update(expires_at=RELEASED)  # the node stays named: it alone may take it back as it was
                        continue
                    row["expires_at"] = me["expires_at"]
                    held[pair] = row["epoch"]
                    if plan.get(pair) != self.node:
                        give_up.add(pair)
                elif plan.get(pair) == self.node and not leave and pair not in release:
                    if row is None:
                        row = by_pair[pair] = {"kind": "partition", "node": self.node, "url": None,
                                               "topic_id": pair[0], "topic": topic, "partition": pair[1],
                                               "epoch": 1, "since": now, "expires_at": me["expires_at"]}
                    elif row["node"] is None or row["expires_at"] <= now:
                        # Back to the node that held it last, nobody else having taken it since: the same
                        # epoch, whose claim is in the table already. Anyone else: a new epoch to claim.
                        epoch = row["epoch"] if row["node"] == self.node else row["epoch"] + 1
                        row.update(node=self.node, epoch=epoch, since=now, expires_at=me["expires_at"], topic=topic)
                    else:
                        continue  # still another node's: it drains and releases it, or its lease runs out
                    held[pair] = row["epoch"]
                    taken.add(pair)
            partitions = sorted(by_pair.values(), key=lambda r: (r["topic_id"], r["partition"]))
            new_rows = sorted(nodes, key=lambda r: r["node"]) + partitions + pins
            return new_rows, Heartbeat(held, frozenset(taken), frozenset(give_up), _view(new_rows, now))

        return self.table.mutate(change)

    def raise_epoch(self, pair: Pair, epoch: int) -> int | None:
        """Lift the epoch of a lease this node holds to at least `epoch` (the topic table holds a newer
        one than this table remembers: it was reset, or restored from a replica); None if not held."""

        def change(rows: Rows) -> tuple[Rows, int | None]:
            now = self._clock()
            out = [dict(r) for r in rows]
            for r in out:
                if r["kind"] == "partition" and (r["topic_id"], r["partition"]) == pair:
                    if r["node"] != self.node or r["expires_at"] <= now:
                        return rows, None
                    r["epoch"] = max(r["epoch"], epoch)
                    return out, r["epoch"]
            return rows, None

        return self.table.mutate(change)

    def pin(self, pair: Pair, topic: str, node: str | None) -> None:
        """Keep `pair` on `node` while it is alive (its owner hands it over); None: back to the plan."""

        def change(rows: Rows) -> tuple[Rows, None]:
            out = [r for r in rows if not (r["kind"] == "pin" and (r["topic_id"], r["partition"]) == pair)]
            if node is not None:
                now = self._clock()
                out.append({"kind": "pin", "node": node, "url": None, "topic_id": pair[0], "topic": topic,
                            "partition": pair[1], "epoch": 0, "since": now, "expires_at": now})
            return out, None

        self.table.mutate(change)

    def forget_topic(self, topic_id: str) -> None:
        """A deleted topic's partitions (and pins) leave the table."""
        self.table.mutate(lambda rows: ([r for r in rows if r["topic_id"] != topic_id], None))


def read_view(layout: Layout) -> ClusterView:
    """The cluster as the table shows it, for a reader that is no node (the CLI)."""
    return _view(StateTable(layout.owners_table, OWNERS_SCHEMA, OWNERS_SCHEMA_VERSION).read(), datetime.now(UTC))
