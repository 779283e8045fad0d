"""Topic admin: create, list, show (with per-partition offsets), change and delete."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Response

from lakebroker.ingest_api.auth import PrincipalDep, check_topic
from lakebroker.ingest_api.deps import BrokerDep, TopicPath
from lakebroker.ingest_api.reader import log_start, partition_files
from lakebroker.ingest_api.schemas import ErrorPublic, PartitionPublic, TopicCreate, TopicPublic, TopicUpdate
from lakebroker.tables.layout import validate_name
from lakebroker.tables.topics import TopicConfig

router = APIRouter(prefix="/v1/topics", tags=["topics"])
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorPublic} for code in (400, 404, 409, 422)}


async def _public(broker: BrokerDep, topic: TopicConfig, with_offsets: bool) -> TopicPublic:
    out = TopicPublic(**topic.public())
    if with_offsets:
        await broker.follow_ends(topic)
        files = await asyncio.to_thread(partition_files, broker.layout, topic)
        out.partition_offsets = []
        for p in range(topic.partitions):
            f = files.get(p)
            committed = broker.committed_end(topic, p)
            out.partition_offsets.append(PartitionPublic(
                partition=p, log_start_offset=log_start(f, committed), log_end_offset=broker.assigned_end(topic, p),
                high_watermark=committed, committed_offset=committed, size_bytes=f.size_bytes if f else 0,
                files=f.files if f else 0,
            ))
    return out


@router.post("", status_code=201, responses=_ERRORS)
async def create_topic(body: TopicCreate, broker: BrokerDep, principal: PrincipalDep) -> TopicPublic:
    validate_name(body.name)
    check_topic(principal, body.name)
    topic = body.topic(broker.settings.default_partitions, broker.settings.default_max_message_bytes)
    return await _public(broker, await broker.create_topic(topic), with_offsets=False)


@router.get("")
async def list_topics(broker: BrokerDep, principal: PrincipalDep) -> list[TopicPublic]:
    """Every topic the caller's token may use."""
    topics = sorted((t for t in broker.topics.values() if principal.allows_topic(t.name)), key=lambda t: t.name)
    return [TopicPublic(**t.public()) for t in topics]


@router.get("/{topic}", responses=_ERRORS)
async def get_topic(topic: TopicPath, broker: BrokerDep) -> TopicPublic:
    return await _public(broker, broker.topic(topic), with_offsets=True)


@router.patch("/{topic}", responses=_ERRORS)
async def update_topic(topic: TopicPath, body: TopicUpdate, broker: BrokerDep) -> TopicPublic:
    changes = body.model_dump(exclude_unset=True)
    return await _public(broker, await broker.update_topic(topic, **changes), with_offsets=False)


@router.delete("/{topic}", status_code=204, responses=_ERRORS)
async def delete_topic(topic: TopicPath, broker: BrokerDep) -> Response:
    await broker.delete_topic(topic)
    return Response(status_code=204)
