"""WAL damage: the partitions held at offsets a corrupt WAL span lost, and the skip that records
the loss and moves a partition on (`lakebroker wal skip` calls it on a running server)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from lakebroker.ingest_api.auth import PrincipalDep
from lakebroker.ingest_api.deps import BrokerDep
from lakebroker.ingest_api.schemas import ErrorPublic, LostOffsetsPublic, WalDamagePublic, WalSkip
from lakebroker.tables.lost_offsets import LostOffsets, lost_offsets

router = APIRouter(prefix="/v1/wal", tags=["operations"])
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorPublic} for code in (400, 404, 422, 507)}


@router.get("/damage")
async def list_damage(broker: BrokerDep) -> list[WalDamagePublic]:
    """Offsets lost to WAL damage, per partition held until it is skipped."""
    return [WalDamagePublic.model_validate(d.public()) for d in broker.damage.all()]


@router.get("/lost")
async def list_lost(broker: BrokerDep) -> list[LostOffsetsPublic]:
    """Every loss an operator skipped, oldest first (`_system/lost_offsets`)."""
    return [_public(loss) for loss in await asyncio.to_thread(lost_offsets, broker.layout)]


@router.post("/damage/skip", responses=_ERRORS)
async def skip_damage(body: WalSkip, broker: BrokerDep, principal: PrincipalDep) -> LostOffsetsPublic:
    """Record a held partition's first lost range, and move the partition past it."""
    return _public(await broker.skip_lost(body.topic, body.partition, principal.label()))


def _public(loss: LostOffsets) -> LostOffsetsPublic:
    return LostOffsetsPublic(topic=loss.topic, partition=loss.partition, first_offset=loss.first_offset,
                             last_offset=loss.last_offset, wal_damage=loss.wal_damage,
                             skipped_at=loss.skipped_at.isoformat(), skipped_by=loss.skipped_by)
