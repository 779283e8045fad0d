"""The cluster as the ownership table shows it: its nodes, and every topic partition's owner."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from lakebroker.ingest_api.auth import PrincipalDep
from lakebroker.ingest_api.deps import BrokerDep
from lakebroker.ingest_api.schemas import ClusterPublic, NodePublic, PartitionOwnerPublic

router = APIRouter(prefix="/v1/cluster", tags=["cluster"])


@router.get("")
async def cluster(broker: BrokerDep, principal: PrincipalDep) -> ClusterPublic:
    """The nodes sharing this table root and the owner of each partition of every topic the caller's
    token may use. Clients send a partition's messages to its owner's URL (any node forwards)."""
    view = await asyncio.to_thread(broker.cluster.table.view)
    live = view.live_nodes()
    nodes = [NodePublic(id=n.node, url=n.url, since=n.since.isoformat(), lease_expires_at=n.expires_at.isoformat(),
                        alive=n.node in live, draining=n.draining, kafka=n.kafka) for n in view.nodes]
    partitions = []
    for topic in sorted(broker.topics.values(), key=lambda t: t.name):
        if not principal.allows_topic(topic.name):
            continue
        for p in range(topic.partitions):
            row = view.owners.get((topic.topic_id, p))
            owner = view.owner_of((topic.topic_id, p))
            partitions.append(PartitionOwnerPublic(
                topic=topic.name, partition=p, owner=None if owner is None else owner.node,
                url=None if owner is None else owner.url, epoch=0 if row is None else row.epoch,
                since=None if row is None or owner is None else row.since.isoformat()))
    return ClusterPublic(node=broker.cluster.node, nodes=nodes, partitions=partitions)
