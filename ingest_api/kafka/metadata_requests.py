"""Kafka's Metadata: the brokers a client may reach and each partition's leader (brokers.py).

A partition with no live owner that has a Kafka listener (not yet claimed, or its owner just
died) is LEADER_NOT_AVAILABLE: the client waits and asks again rather than send it to a node that
would refuse it."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from lakebroker.ingest_api.kafka import wire
from lakebroker.ingest_api.kafka.brokers import Brokers
from lakebroker.ingest_api.kafka.errors import may_see
from lakebroker.ingest_api.node_identity import CLUSTER_ID
from lakebroker.ingest_api.produce_core import ProduceCore
from lakebroker.tables.tokens import ApiToken

METADATA = 3
_ZERO = timedelta(0)


class MetadataRequests:
    def __init__(self, core: ProduceCore, brokers: Brokers) -> None:
        self.core = core
        self.brokers = brokers

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
                                  partitions=self._partitions(schema, topic.topic_id, topic.partitions)))
        entry = wire.nested(schema, "MetadataResponseBroker")
        brokers = tuple(wire.build(entry, node_id=b.id, host=b.host, port=b.port, rack=None)
                        for b in self.brokers.live())
        return wire.frame_of(request, wire.build(schema, throttle_time=_ZERO, brokers=brokers, cluster_id=CLUSTER_ID,
                                                 controller_id=self.brokers.own_id, topics=tuple(out)))

    def _partitions(self, schema: Any, topic_id: str, count: int) -> tuple[object, ...]:
        entry = wire.nested(schema, "MetadataResponsePartition")
        out = []
        for p in range(count):
            leader = self.brokers.leader(topic_id, p)
            if leader is None:
                out.append(wire.build(entry, partition_index=p, error_code=ErrorCode.leader_not_available,
                                      leader_id=-1, leader_epoch=-1, replica_nodes=(), isr_nodes=(),
                                      offline_replicas=()))
                continue
            out.append(wire.build(entry, partition_index=p, error_code=ErrorCode.none, leader_id=leader.broker,
                                  leader_epoch=leader.epoch, replica_nodes=(leader.broker,),
                                  isr_nodes=(leader.broker,), offline_replicas=()))
        return tuple(out)
