"""The cluster as Kafka clients see it, from the ownership table's last heartbeat.

Every live node whose Kafka listener is in its node row is a broker (each worker of
`serve --workers` too, on a port of its own). A broker's id is a hash of its node id, the same on
every node. A partition's leader is its owner, with the owner's epoch as the leader epoch: a
client sends each partition's records to its owner, and a node that does not own a partition
refuses it (NOT_LEADER_OR_FOLLOWER), so the client reads the metadata again.

A consumer group's coordinator is one live node, chosen by rendezvous hashing of the group's
name over the live brokers: every node computes the same choice from the same heartbeat, and a
node joining or leaving moves only the groups it takes or held."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.cluster import Membership
from lakebroker.ingest_api.wal import PartitionKey
from lakebroker.tables.ownership import NodeInfo


@dataclass(frozen=True, slots=True)
class KafkaBroker:
    id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Leader:
    broker: int
    epoch: int


def broker_id(node: str) -> int:
    """A node's broker id: a non-negative int32, as Kafka's node ids are."""
    return zlib.crc32(node.encode()) & 0x7FFFFFFF


def _address(node: NodeInfo) -> tuple[str, int] | None:
    if not node.kafka:
        return None
    host, _, port = node.kafka.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


class Brokers:
    def __init__(self, broker: Broker, address: Callable[[], tuple[str, int]]) -> None:
        """`broker`: its cluster membership and ownership, which exist once it has started;
        `address`: where clients reach this node's listener."""
        self.broker = broker
        self.address = address

    @property
    def membership(self) -> Membership:
        return self.broker.cluster

    @property
    def epochs(self) -> dict[PartitionKey, int]:
        """The partitions this node has open, with their epochs."""
        return self.broker.ownership.epochs

    @property
    def own_id(self) -> int:
        return broker_id(self.membership.node)

    def own(self) -> KafkaBroker:
        host, port = self.address()
        return KafkaBroker(self.own_id, host, port)

    def live(self) -> list[KafkaBroker]:
        """Every live node with a Kafka listener, this one first (as it is now, whatever its row says)."""
        return [self.own(), *(broker for _, broker in self._peers())]

    def _peers(self) -> list[tuple[NodeInfo, KafkaBroker]]:
        """The other live nodes of the last heartbeat's view that have a Kafka listener."""
        view = self.membership.view
        out = []
        for node in [] if view is None else view.live_nodes().values():
            address = _address(node)
            if node.node != self.membership.node and address is not None:
                out.append((node, KafkaBroker(broker_id(node.node), *address)))
        return out

    def leader(self, topic_id: str, partition: int) -> Leader | None:
        """The partition's owner as a broker: this node while it has the partition open, else the
        live owner of the last heartbeat's view, if that owner has a Kafka listener."""
        epoch = self.epochs.get((bytes.fromhex(topic_id), partition))
        if epoch is not None:
            return Leader(self.own_id, epoch)
        view = self.membership.view
        if view is None:
            return None
        owner = view.owner_of((topic_id, partition))
        if owner is None or owner.node == self.membership.node or _address(owner) is None:
            return None  # another node's, not yet claimed; or this node's lease, not yet open here
        return Leader(broker_id(owner.node), view.owners[(topic_id, partition)].epoch)

    def coordinator(self, group: str) -> KafkaBroker:
        """The broker that coordinates `group`: of the live brokers not draining, the one with the
        highest hash of (group, node). A draining node hands its groups on, unless it is alone."""
        return _pick(group, self._candidates()) or self.own()

    def coordinates(self, group: str) -> bool:
        return group in self.coordinated((group,))

    def coordinated(self, groups: Iterable[str]) -> set[str]:
        """Those of `groups` this node coordinates, judged on one list of the live brokers."""
        candidates = self._candidates()
        return {g for g in groups if (_pick(g, candidates) or self.own()).id == self.own_id}

    def _candidates(self) -> list[tuple[str, KafkaBroker]]:
        """The brokers that may coordinate groups, by node id: the live ones not draining."""
        me = self.membership.node
        view = self.membership.view
        draining = view is not None and any(n.node == me and n.draining for n in view.live_nodes().values())
        candidates = [] if draining else [(me, self.own())]
        return candidates + [(node.node, broker) for node, broker in self._peers() if not node.draining]


def _pick(group: str, candidates: list[tuple[str, KafkaBroker]]) -> KafkaBroker | None:
    """Rendezvous hashing: the candidate with the highest hash of (group, node id)."""
    if not candidates:
        return None
    return max(candidates, key=lambda c: zlib.crc32(f"{group}\0{c[0]}".encode()))[1]
