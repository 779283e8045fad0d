"""Kafka's Metadata: the brokers a client may reach and each partition's leader.

This node is the one broker, and the leader of the partitions it owns, with its ownership epoch
as the leader epoch. Another node's partition, or one not yet claimed, is LEADER_NOT_AVAILABLE
here: the client waits and asks again rather than send it to a node that would refuse it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from lakebroker.ingest_api.kafka import wire
from lakebroker.ingest_api.kafka.errors import may_see
from lakebroker.ingest_api.node_identity import CLUSTER_ID
from lakebroker.ingest_api.produce_core import ProduceCore
from lakebroker.tables.tokens import ApiToken

METADATA = 3
_ZERO = timedelta(0)


class MetadataRequests:
    def __init__(self, core: ProduceCore, broker_id: int, address: Callable[[], tuple[str, int]]) -> None:
        """`address`: the host and port clients reach this node's listener at."""
        self.core = core
        self.broker_id = broker_id
        self.address = address

    def answer(self, principal: ApiToken, request: wire.Request) -> bytes:
        """The topics asked (every one the token may see when none is named)."""
        schema = wire.response_schema(METADATA, request.version)
        topic_entry = wire.nested(schema, "MetadataResponseTopic")
        topics = self.core.broker.topics
        asked = None if request.body.topics is None else [t.name for t in request.body.topics]
        names = sorted(n for n in topics if may_see(principal, n)) if asked is None else asked
        out = []
        for name in names:
            topic = topics.get(name) if name is not None else None
            if topic is None or not may_see(principal, name):
                error = ErrorCode.unknown_topic_or_partition if topic is None else ErrorCode.topic_authorization_failed
                out.append(wire.build(topic_entry, error_code=error, name=name, topic_id=uuid.UUID(int=0),
                                      partitions=()))
                continue
            out.append(wire.build(topic_entry, error_code=ErrorCode.none, name=name,
                                  topic_id=uuid.UUID(hex=topic.topic_id[:32].ljust(32, "0")),
                                  partitions=self._partitions(schema, bytes.fromhex(topic.topic_id),
                                                              topic.partitions)))
        host, port = self.address()
        brokers = (wire.build(wire.nested(schema, "MetadataResponseBroker"), node_id=self.broker_id, host=host,
                              port=port),)
        return wire.frame_of(request, wire.build(schema, throttle_time=_ZERO, brokers=brokers, cluster_id=CLUSTER_ID,
                                                 controller_id=self.broker_id, topics=tuple(out)))

    def _partitions(self, schema: Any, topic_key: bytes, count: int) -> tuple[object, ...]:
        entry = wire.nested(schema, "MetadataResponsePartition")
        epochs = self.core.broker.ownership.epochs
        out = []
        for p in range(count):
            epoch = epochs.get((topic_key, p))
            out.append(wire.build(
                entry, partition_index=p,
                error_code=ErrorCode.none if epoch is not None else ErrorCode.leader_not_available,
                leader_id=self.broker_id if epoch is not None else -1, leader_epoch=-1 if epoch is None else epoch,
                replica_nodes=(self.broker_id,), isr_nodes=(self.broker_id,), offline_replicas=()))
        return tuple(out)
