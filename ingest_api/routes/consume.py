"""Pull consume: read a partition from its Delta table by offset or by timestamp."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime

from fastapi import APIRouter, Query

from lakebroker.ingest_api.deps import BrokerDep, TopicPath
from lakebroker.ingest_api.reader import log_start, offset_for_timestamp, partition_files, read_messages
from lakebroker.ingest_api.responses import JSONBytes
from lakebroker.ingest_api.schemas import MAX_INT, ErrorPublic, MessagesPublic
from lakebroker.tables.errors import InvalidRequest

router = APIRouter(prefix="/v1/topics", tags=["consume"])


_EPOCH_MS = re.compile(r"-?[0-9]{1,20}")
_MAX_US = 253_402_300_800 * 1_000_000  # 9999-12-31T24:00Z: past any timestamp a message can hold


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds, or ISO 8601 (UTC when no zone is given), as epoch microseconds."""
    if _EPOCH_MS.fullmatch(text):  # ASCII digits only: str.isdigit() also takes '²', which int() refuses
        micros = int(text) * 1000
    else:
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            micros = int(moment.timestamp() * 1_000_000)
        except (ValueError, OverflowError):
            raise InvalidRequest(f"timestamp {text!r} is neither epoch milliseconds nor ISO 8601") from None
    if not -_MAX_US <= micros <= _MAX_US:
        raise InvalidRequest(f"timestamp {text!r} is outside the years 1 to 9999")
    return micros


@router.get(
    "/{topic}/partitions/{partition}/messages",
    responses={200: {"model": MessagesPublic}, **{c: {"model": ErrorPublic} for c in (400, 404, 416, 422)}},
    response_class=JSONBytes,
)
async def read_partition(
    topic: TopicPath,
    partition: int,
    broker: BrokerDep,
    offset: int | None = Query(None, ge=0, le=MAX_INT, description="First offset to read; default the log start."),
    timestamp: str | None = Query(None, description="Start at the first message at or after this time "
                                  "(epoch ms or ISO 8601); instead of offset."),
    limit: int = Query(100, ge=1, le=10_000),
) -> JSONBytes:
    config = broker.topic(topic)
    config.check_partition(partition)
    if offset is not None and timestamp is not None:
        raise InvalidRequest("give offset or timestamp, not both")
    await broker.follow_ends(config)
    committed = broker.committed_end(config, partition)
    if timestamp is not None:
        found = await asyncio.to_thread(offset_for_timestamp, broker.layout, config, partition,
                                        parse_timestamp(timestamp))
        offset = committed if found is None else found
    if offset is None:
        files = await asyncio.to_thread(partition_files, broker.layout, config)
        offset = log_start(files.get(partition), committed)
    body = await asyncio.to_thread(read_messages, broker.layout, config, partition, offset, limit, committed)
    return JSONBytes(body)
