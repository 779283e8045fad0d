"""Health and readiness (answered without a token), and Prometheus metrics (its own router, so
the app decides its access separately: setting metrics_public)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lakebroker.ingest_api.deps import BrokerDep
from lakebroker.ingest_api.responses import JSONBytes
from lakebroker.ingest_api.subscription_status import pull_group_lags

router = APIRouter(tags=["operations"])
metrics_router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "Not ready; the body says why."}})
async def readyz(broker: BrokerDep) -> JSONBytes:
    """Ready to take produce traffic: recovered, committing to Delta, and under the backlog bound."""
    problems = []
    if not broker.started:
        problems.append("recovery has not finished")
    if not broker.flusher.healthy:
        problems.append("Delta commits are failing (see logs); messages wait in the WAL")
    if broker.backlog_bytes > broker.settings.max_backlog_bytes:
        problems.append("WAL backlog is over max_backlog_bytes")
    for damage in broker.damage.firsts():
        problems.append(f"{damage.describe()}: the partition is held until `lakebroker wal skip {damage.topic} "
                        f"{damage.partition}` records the loss and moves it on")
    if problems:
        return JSONBytes({"status": "not ready", "problems": problems}, status_code=503)
    return JSONBytes({"status": "ready"})


@metrics_router.get(
    "/metrics", response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                     "description": "Prometheus text format."}},
)
async def metrics(broker: BrokerDep) -> Response:
    """Prometheus text format."""
    broker.metrics.wal_backlog_bytes.set(broker.backlog_bytes)
    broker.metrics.topic_unavailable.clear()  # a topic deleted since the last scrape goes too
    await broker.follow_all_ends()
    for topic in broker.topics.values():
        unavailable = topic.topic_id in broker.ownership.unreadable
        broker.metrics.topic_unavailable.labels(topic.name).set(1 if unavailable else 0)
        for p in range(topic.partitions):
            broker.metrics.assigned_end.labels(topic.name, str(p)).set(broker.assigned_end(topic, p))
            broker.metrics.set_high_watermark(topic.name, p, broker.committed_end(topic, p))
            broker.metrics.wal_lost_offsets.labels(topic.name, str(p)).set(broker.lost_offsets(topic, p))
    committed = await asyncio.to_thread(broker.group_offsets.latest)
    broker.metrics.group_lag.clear()  # a group or partition gone since the last scrape goes too
    for g in pull_group_lags(broker, committed):
        if broker.ownership.owns(g["topic"], g["partition"]):
            broker.metrics.group_lag.labels(g["group"], g["topic"], str(g["partition"])).set(g["lag"])
    return Response(generate_latest(broker.metrics.registry), media_type=CONTENT_TYPE_LATEST)
