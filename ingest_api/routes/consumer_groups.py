"""Consumer-group offsets for pull consumers: where a group reading `GET .../messages` has got to.

The positions live in the `_system/consumer_offsets` table beside the push subscriptions', as
the *next* offset to read. A pull group is stored under the name `pull:<group>`: group and
subscription names cannot contain ':', so a pull group never moves a subscription's offsets,
and the offsets-compaction job keeps the newest row of each like any other group.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from lakebroker.ingest_api.deps import BrokerDep
from lakebroker.ingest_api.schemas import ErrorPublic
from lakebroker.tables.errors import OutOfRange
from lakebroker.tables.offsets import OffsetReason, OffsetsTable, pull_group

router = APIRouter(prefix="/v1/topics", tags=["consumer-groups"])
_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorPublic} for c in (400, 404, 416, 422)}



class GroupOffsetsCommit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    offsets: dict[int, int] = Field(min_length=1, description="Next offset to read, per partition.")


class GroupOffsetsPublic(BaseModel):
    topic: str
    group: str
    offsets: dict[int, int] = Field(description="Next offset to read, per partition that has a committed one.")


def _read(broker: BrokerDep, topic: str, group: str) -> GroupOffsetsPublic:
    offsets = OffsetsTable(broker.layout).of_topic(pull_group(group), topic)
    return GroupOffsetsPublic(topic=topic, group=group, offsets=dict(sorted(offsets.items())))


@router.get("/{topic}/groups/{group}/offsets", responses=_ERRORS)
async def get_group_offsets(topic: str, group: str, broker: BrokerDep) -> GroupOffsetsPublic:
    """A pull consumer group's committed positions on this topic (empty for a group never committed)."""
    broker.topic(topic)
    pull_group(group)
    return await asyncio.to_thread(_read, broker, topic, group)


@router.post("/{topic}/groups/{group}/offsets", responses=_ERRORS)
async def commit_group_offsets(topic: str, group: str, body: GroupOffsetsCommit,
                               broker: BrokerDep) -> GroupOffsetsPublic:
    """Commit positions (next offset to read) of some or all partitions; others keep theirs."""
    config = broker.topic(topic)
    name = pull_group(group)
    await broker.follow_ends(config)
    for partition, offset in body.offsets.items():
        config.check_partition(partition)
        end = broker.assigned_end(config, partition)
        if not 0 <= offset <= end:
            raise OutOfRange(f"offset {offset} is outside partition {partition}: valid positions are 0 to {end}")
    await asyncio.to_thread(OffsetsTable(broker.layout).commit, name, topic, body.offsets, OffsetReason.ACK)
    return await asyncio.to_thread(_read, broker, topic, group)
