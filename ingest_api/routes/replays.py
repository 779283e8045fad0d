"""Replays by SQL predicate: a subscription's matching messages sent again to its endpoint, beside
its live position (tables/replays.py holds them, delivery_worker/replay.py sends them)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from lakebroker.ingest_api.deps import BrokerDep
from lakebroker.ingest_api.reader import log_start, offset_for_timestamp, partition_files
from lakebroker.ingest_api.routes.consume import parse_timestamp
from lakebroker.ingest_api.routes.subscriptions import StoreDep
from lakebroker.ingest_api.schemas import ErrorPublic
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.predicates import MAX_PREDICATE_CHARS, Query, check
from lakebroker.tables.replays import ReplayPart, ReplayState, ReplayTable, new_replay_id
from lakebroker.tables.topics import MAX_PARTITIONS

router = APIRouter(prefix="/v1/subscriptions", tags=["subscriptions"])
_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorPublic} for c in (400, 404, 409, 422)}


class ReplayCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    where: str | None = Field(None, max_length=MAX_PREDICATE_CHARS, description=(
        "A SQL predicate over the topic's columns (partition, offset, timestamp, key, headers, format, "
        "message_id, producer_id, sequence, value as JSON, value_text), e.g. "
        "\"headers['region'] = 'eu' AND (value->>'amount')::DOUBLE > 100\". None: every message in the range."))
    since: str | None = Field(None, description="Messages at or after this time (epoch ms or ISO 8601).")
    until: str | None = Field(None, description="Messages before this time (epoch ms or ISO 8601).")
    from_offset: int | None = Field(None, ge=0, description="In each partition, from this offset.")
    to_offset: int | None = Field(None, ge=0, description="In each partition, up to this offset (included).")
    partitions: list[int] | None = Field(None, min_length=1, max_length=MAX_PARTITIONS,
                                         description="Only these partitions (default: all).")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _time(text: str | None) -> datetime | None:
    return None if text is None else _EPOCH + timedelta(microseconds=parse_timestamp(text))


@router.post("/{name}/replays", status_code=201, responses=_ERRORS)
async def create_replay(name: str, body: ReplayCreate, broker: BrokerDep, store: StoreDep) -> dict[str, Any]:
    """Send again, to the subscription's endpoint, every message committed now that the predicate
    and the ranges keep: in offset order per partition, under the subscription's rate limit and
    signatures, beside its live delivery (which goes on). Progress at GET .../replays/{id}."""
    sub = await asyncio.to_thread(store.get, name)
    topic = broker.topic(sub.topic)
    predicate = None if body.where is None else await asyncio.to_thread(check, body.where)
    since, until = _time(body.since), _time(body.until)
    if since is not None and until is not None and since >= until:
        raise InvalidRequest("since must be before until")
    if body.from_offset is not None and body.to_offset is not None and body.from_offset > body.to_offset:
        raise InvalidRequest("from_offset must not be after to_offset")
    partitions = sorted(set(body.partitions or range(topic.partitions)))
    for p in partitions:
        topic.check_partition(p)
    query = Query(broker.layout.topic_table(topic), predicate, since, until)
    await asyncio.to_thread(query.probe)  # types and functions bound against the columns: 422 now, not later
    await broker.follow_ends(topic)
    files = await asyncio.to_thread(partition_files, broker.layout, topic)
    where = None if predicate is None else predicate.text
    replay_id, parts = new_replay_id(), []
    for p in partitions:
        end = broker.committed_end(topic, p)
        start = max(body.from_offset or 0, log_start(files.get(p), end))
        if since is not None:
            first = await asyncio.to_thread(offset_for_timestamp, broker.layout, topic, p,
                                            int(since.timestamp() * 1_000_000))
            start = max(start, end if first is None else first)
        if body.to_offset is not None:
            end = min(end, body.to_offset + 1)
        start = min(start, end)
        parts.append(ReplayPart(replay_id, sub.name, topic.name, topic.topic_id, p, where, since, until,
                                start_offset=start, end_offset=end, next_offset=start,
                                state=ReplayState.RUNNING if start < end else ReplayState.DONE))
    replay = await asyncio.to_thread(ReplayTable(broker.layout).create, parts)
    return replay.public()


@router.get("/{name}/replays", responses=_ERRORS)
async def list_replays(name: str, broker: BrokerDep, store: StoreDep) -> dict[str, Any]:
    """The subscription's replays, newest first (finished ones are kept 7 days)."""
    await asyncio.to_thread(store.get, name)
    return {"replays": [r.public() for r in await asyncio.to_thread(ReplayTable(broker.layout).replays, name)]}


@router.get("/{name}/replays/{replay_id}", responses=_ERRORS)
async def get_replay(name: str, replay_id: str, broker: BrokerDep, store: StoreDep) -> dict[str, Any]:
    """A replay's progress: matched (found so far), delivered, failed (retries spent), scanned of
    to_scan offsets, and its state (running, done, cancelled, failed with its error)."""
    await asyncio.to_thread(store.get, name)
    return (await asyncio.to_thread(ReplayTable(broker.layout).get, name, replay_id)).public()


@router.delete("/{name}/replays/{replay_id}", responses=_ERRORS)
async def cancel_replay(name: str, replay_id: str, broker: BrokerDep, store: StoreDep) -> dict[str, Any]:
    """Cancel a running replay: its workers stop before their next chunk. A finished one is left as it is."""
    await asyncio.to_thread(store.get, name)
    return (await asyncio.to_thread(ReplayTable(broker.layout).cancel, name, replay_id)).public()
