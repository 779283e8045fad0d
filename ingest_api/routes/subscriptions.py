"""Subscriptions: webhook push consumer groups, their status, seek, and dead letters."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from lakebroker.ingest_api.auth import PrincipalDep
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.deps import BrokerDep
from lakebroker.ingest_api.reader import log_start, offset_for_timestamp, partition_files
from lakebroker.ingest_api.routes.consume import parse_timestamp
from lakebroker.ingest_api.schemas import DEPRECATED_END, MAX_INT, ErrorPublic
from lakebroker.ingest_api.subscription_status import read_groups, subscription_status
from lakebroker.tables.dead_letters import DeadLetterTable
from lakebroker.tables.errors import InvalidRequest, OutOfRange
from lakebroker.tables.filters import MAX_FILTER_CHARS
from lakebroker.tables.leases import LeaseTable
from lakebroker.tables.offsets import OffsetReason, OffsetsTable
from lakebroker.tables.replays import ReplayTable
from lakebroker.tables.subscriptions import (
    DEFAULT_BREAKER_COOLDOWN_MS,
    DEFAULT_BREAKER_FAILURES,
    DEFAULT_BREAKER_MIN_REQUESTS,
    DEFAULT_BREAKER_WINDOW_MS,
    DEFAULT_DISABLE_AFTER_MS,
    DEFAULT_RETRY_SCHEDULE_MS,
    Ordering,
    Subscription,
    SubscriptionStore,
    new_secret,
    redact_url,
    validate_secret,
)
from lakebroker.tables.tokens import Scope
from lakebroker.tables.topics import MAX_PARTITIONS, TopicConfig
from lakebroker.tables.webhook_urls import check_webhook_url

router = APIRouter(prefix="/v1/subscriptions", tags=["subscriptions"])
# Python's JSON parser takes NaN and Infinity, which no bound refuses: these models refuse them.
_INPUT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # strict: true is not 1
RetryDelay = Annotated[float, Field(ge=0, le=86_400)]
_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorPublic} for c in (400, 404, 409, 416, 422)}


class SubscriptionCreate(BaseModel):
    model_config = _INPUT
    name: str = Field(min_length=1, max_length=128)
    topic: str = Field(min_length=1, max_length=128)
    url: str = Field(min_length=1, max_length=2048)
    start: str = Field("latest", description="earliest, latest, or a timestamp (epoch ms or ISO 8601).")
    # Enums arrive as JSON strings; strict mode alone would refuse "partition".
    ordering: Ordering = Field(Ordering.KEY, strict=False, description=(
        "key (default): one message in flight per key, keyless messages in partition order; partition: one "
        "message in flight per partition; none: no order, only the in-flight window."))
    max_in_flight: int = Field(16, ge=1, le=1000)
    rate_limit_per_s: float | None = Field(None, gt=0, le=100_000)
    max_attempts: int = Field(8, ge=1, le=100)
    retry_schedule_s: list[RetryDelay] = Field(
        [d / 1000 for d in DEFAULT_RETRY_SCHEDULE_MS], min_length=1, max_length=50,
        description="Delays before attempts 2, 3, ...; the last repeats. Jittered by ±20 %.",
    )
    timeout_s: float = Field(10.0, ge=0.1, le=120)
    batch_size: int = Field(1, ge=1, le=1000, description="Above 1, POST a JSON array of up to this many.")
    secret: str | None = Field(None, description="whsec_...; generated when absent and returned once.")
    filter: str | None = Field(None, max_length=MAX_FILTER_CHARS, description=(
        'Deliver only the messages it matches, e.g. hasPrefix(key, "eu-") AND value.amount > 100 '
        "(docs/webhooks.md, Filters); null: every message."))
    breaker_failures: int = Field(DEFAULT_BREAKER_FAILURES, ge=0, le=10_000, description=(
        "Endpoint failures in a row (no answer, timeout, 5xx, 408, 429) that open its circuit: sends pause, "
        "spending no attempt, until a probe succeeds. 0: never open."))
    breaker_cooldown_s: float = Field(DEFAULT_BREAKER_COOLDOWN_MS / 1000, ge=1, le=3600,
                                      description="How long the circuit stays open before a probe; doubled after a "
                                                  "failed probe, up to 600 s.")
    disable_after_s: float = Field(DEFAULT_DISABLE_AFTER_MS / 1000, ge=0, le=365 * 86_400, description=(
        "An endpoint failing this long without a success (its circuit open) disables the subscription; "
        "0: never. Re-enable with POST .../resume."))
    breaker_failure_ratio: float | None = Field(None, gt=0, le=1, description=(
        "A share of endpoint failures among the attempts of the last breaker_window_s that opens its circuit "
        "too, once there were breaker_min_requests of them; null: runs only."))
    breaker_window_s: float = Field(DEFAULT_BREAKER_WINDOW_MS / 1000, ge=1, le=3600)
    breaker_min_requests: int = Field(DEFAULT_BREAKER_MIN_REQUESTS, ge=1, le=100_000)


class SubscriptionUpdate(BaseModel):
    # Only the fields given change; rate_limit_per_s takes null (no limit), the other fields cannot
    # be null (their None defaults only mark them as not given).
    model_config = _INPUT
    url: str = Field(None, min_length=1, max_length=2048)  # type: ignore[assignment]
    ordering: Ordering = Field(None, strict=False)  # type: ignore[assignment]
    max_in_flight: int = Field(None, ge=1, le=1000)  # type: ignore[assignment]
    rate_limit_per_s: float | None = Field(None, gt=0, le=100_000)
    max_attempts: int = Field(None, ge=1, le=100)  # type: ignore[assignment]
    retry_schedule_s: list[RetryDelay] | None = Field(None, min_length=1, max_length=50)
    timeout_s: float | None = Field(None, ge=0.1, le=120)
    batch_size: int = Field(None, ge=1, le=1000)  # type: ignore[assignment]
    secret: str | None = Field(None, description="A new signing secret; the previous one keeps signing too.")
    rotate_secret: bool = Field(False, description="Generate a new secret; the previous one keeps signing too.")
    end_rotation: bool = Field(False, description="Stop signing with the previous secret.")
    filter: str | None = Field(None, max_length=MAX_FILTER_CHARS,
                               description="A new filter, from the next message delivered; null removes it.")
    breaker_failures: int = Field(None, ge=0, le=10_000)  # type: ignore[assignment]
    breaker_cooldown_s: float | None = Field(None, ge=1, le=3600)
    disable_after_s: float | None = Field(None, ge=0, le=365 * 86_400)
    breaker_failure_ratio: float | None = Field(None, gt=0, le=1, description="null: runs only.")
    breaker_window_s: float | None = Field(None, ge=1, le=3600)
    breaker_min_requests: int = Field(None, ge=1, le=100_000)  # type: ignore[assignment]


class SeekRequest(BaseModel):
    model_config = _INPUT
    to: Literal["earliest", "latest"] | None = None
    timestamp: str | None = None
    offsets: dict[str, int] | None = Field(
        None, description='Next offset to deliver, per partition: {"0": 42}.'
    )


class ReplayRequest(BaseModel):
    model_config = _INPUT
    partition: int | None = Field(None, ge=0, le=MAX_PARTITIONS - 1)
    from_offset: int | None = Field(None, ge=0, le=MAX_INT)
    to_offset: int | None = Field(None, ge=0, le=MAX_INT)


class RetentionSkipPublic(BaseModel):
    skipped_at: str = Field(description="When the retention job moved the group (ISO 8601, UTC).")
    from_offset: int = Field(description="The group's committed offset before the skip.")
    to_offset: int = Field(description="The partition's new log start, where the group was moved.")
    messages: int = Field(description="Undelivered messages skipped: to_offset - from_offset.")
    run_id: str = Field(description="The retention run (see `lakebroker job-runs`).")


class RetentionSkipsPublic(BaseModel):
    """The durable record (`_system/retention_skips`) of the retention job moving this group past
    messages it had not delivered, since the subscription was created."""

    skips: int
    messages: int = Field(description="Undelivered messages skipped in all.")
    last: RetentionSkipPublic | None = Field(description="The latest skip; null if there was none.")


class PartitionStatusPublic(BaseModel):
    partition: int
    committed_offset: int = Field(description="Next offset to deliver.")
    last_commit_reason: str = Field(description="Why the offset last moved: start, ack, seek, retention-skip, ...")
    high_watermark: int = Field(description="Offsets below this are committed to the Delta table.")
    log_end_offset: int = Field(description=f"Deprecated: {DEPRECATED_END}", json_schema_extra={"deprecated": True})
    lag: int
    in_flight: int
    delivered: int = Field(description="Delivered by the partition's current worker (live).")
    dead_lettered: int = Field(description="Dead-lettered by the partition's current worker (live).")
    retention_skipped: int = Field(description="Messages the partition's current worker found already removed "
                                               "by retention when it read (live; see retention_skips for the "
                                               "durable record).")
    retention_skips: RetentionSkipsPublic
    last_status: int | None = Field(description="HTTP status of the last delivery attempt.")
    last_error: str | None
    state: str = Field(description="healthy, backing_off, circuit_open (the endpoint's circuit is open: sends wait for "
                       "its probe), disabled, paused or idle.")
    owner: str | None = Field(description="The delivery worker holding the partition's lease.")


class HealthPublic(BaseModel):
    state: Literal["healthy", "failing", "open", "disabled"] = Field(description=(
        "healthy; failing (retrying failures); open (the endpoint's circuit is open: sends wait for a probe); "
        "disabled (410 Gone, failing past disable_after_s, or by an operator)."))
    since: str | None = Field(description="When the endpoint began failing (its circuit first opened), if it is.")
    last_error: str | None


class SubscriptionStatusPublic(BaseModel):
    name: str
    topic: str
    url: str
    ordering: Ordering
    max_in_flight: int
    rate_limit_per_s: float | None
    max_attempts: int
    retry_schedule_ms: list[int]
    timeout_ms: int
    batch_size: int
    paused: bool
    disabled_reason: str | None
    seek_epoch: int
    created_at: str
    filter: str | None
    breaker_failures: int
    breaker_cooldown_ms: int
    breaker_failure_ratio: float | None
    breaker_window_ms: int
    breaker_min_requests: int
    disable_after_ms: int
    failing_since: str | None
    health: HealthPublic
    endpoint_state: Literal["active", "paused", "disabled"]
    secret: str = Field(description="Masked.")
    dead_letters: int = Field(description="Dead letters not yet replayed.")
    partitions: list[PartitionStatusPublic]


def _store(request: Request) -> SubscriptionStore:
    return SubscriptionStore(request.app.state.broker.layout)


StoreDep = Annotated[SubscriptionStore, Depends(_store)]


def _schedule_ms(delays: list[float]) -> tuple[int, ...]:
    return tuple(int(d * 1000) for d in delays)


async def _check_url(broker: Broker, url: str) -> str:
    return await asyncio.to_thread(check_webhook_url, url, allow_private=broker.settings.allow_private_webhooks)


async def _targets(broker: Broker, topic: TopicConfig, how: str) -> dict[int, int]:
    """Per-partition offsets for earliest, latest or a timestamp."""
    await broker.follow_ends(topic)
    files = await asyncio.to_thread(partition_files, broker.layout, topic)
    out: dict[int, int] = {}
    for p in range(topic.partitions):
        committed = broker.committed_end(topic, p)
        if how == "earliest":
            out[p] = log_start(files.get(p), committed)
        elif how == "latest":
            out[p] = broker.assigned_end(topic, p)
        else:
            found = await asyncio.to_thread(offset_for_timestamp, broker.layout, topic, p, parse_timestamp(how))
            out[p] = committed if found is None else found
    return out


async def _status(request: Request, broker: Broker, sub: Subscription) -> SubscriptionStatusPublic:
    if sub.topic in broker.topics:
        await broker.follow_ends(broker.topics[sub.topic])
    groups = await asyncio.to_thread(read_groups, broker.layout, sub.name, with_retention_skips=True)
    return SubscriptionStatusPublic.model_validate(subscription_status(broker, request.app.state.live_status, sub,
                                                                       groups))


@router.post("", status_code=201, responses=_ERRORS)
async def create_subscription(body: SubscriptionCreate, broker: BrokerDep, store: StoreDep) -> dict[str, Any]:
    """Create a push subscription; the response carries the signing secret, shown only this once."""
    topic = broker.topic(body.topic)
    url = await _check_url(broker, body.url)
    if body.start not in ("earliest", "latest"):
        parse_timestamp(body.start)
    secret = validate_secret(body.secret) if body.secret else new_secret()
    start = await _targets(broker, topic, body.start)
    # The row carries its start (as the targets of seek epoch 0), so a worker that reads it before
    # the START offsets below are committed, or after a crash between the two writes, still starts there.
    sub = Subscription(
        name=body.name, topic=body.topic, url=url, ordering=body.ordering, max_in_flight=body.max_in_flight,
        rate_limit_per_s=body.rate_limit_per_s, max_attempts=body.max_attempts,
        retry_schedule_ms=_schedule_ms(body.retry_schedule_s), timeout_ms=int(body.timeout_s * 1000),
        batch_size=body.batch_size, secrets=(secret,), seek_offsets=start, filter=body.filter,
        breaker_failures=body.breaker_failures, breaker_cooldown_ms=int(body.breaker_cooldown_s * 1000),
        disable_after_ms=int(body.disable_after_s * 1000), breaker_failure_ratio=body.breaker_failure_ratio,
        breaker_window_ms=int(body.breaker_window_s * 1000), breaker_min_requests=body.breaker_min_requests,
    )
    created = await asyncio.to_thread(store.create, sub)
    await asyncio.to_thread(OffsetsTable(broker.layout).commit, sub.name, sub.topic, start, OffsetReason.START)
    return created.public(reveal_secret=True)


@router.get("")
async def list_subscriptions(store: StoreDep, principal: PrincipalDep) -> list[dict[str, Any]]:
    """Every subscription (secret masked; the URL whole for admin tokens, else its origin alone)."""
    subs = await asyncio.to_thread(store.load)
    reveal_url = principal.has(Scope.ADMIN)
    return [s.public(reveal_url=reveal_url) for s in sorted(subs.values(), key=lambda s: s.name)]


@router.get("/{name}", responses=_ERRORS)
async def get_subscription(name: str, request: Request, broker: BrokerDep, store: StoreDep,
                           principal: PrincipalDep) -> SubscriptionStatusPublic:
    """Configuration (secret masked; the URL whole for admin tokens, else its origin alone) and
    per-partition committed offset, lag, in-flight, last error, state, and the messages retention
    removed before the group delivered them."""
    sub = await asyncio.to_thread(store.get, name)
    status = await _status(request, broker, sub)
    if not principal.has(Scope.ADMIN):
        status.url = redact_url(status.url)
    return status


@router.patch("/{name}", responses=_ERRORS)
async def update_subscription(name: str, body: SubscriptionUpdate, broker: BrokerDep,
                              store: StoreDep) -> dict[str, Any]:
    """Change configuration. A new or rotated secret is returned once; both secrets sign until end_rotation."""
    current = await asyncio.to_thread(store.get, name)
    changes: dict[str, Any] = body.model_dump(exclude_unset=True, exclude={"secret", "rotate_secret",
                                                                           "end_rotation", "retry_schedule_s",
                                                                           "timeout_s", "breaker_cooldown_s",
                                                                           "disable_after_s", "breaker_window_s"})
    if body.url is not None:
        changes["url"] = await _check_url(broker, body.url)
    if body.retry_schedule_s is not None:
        changes["retry_schedule_ms"] = _schedule_ms(body.retry_schedule_s)
    if body.timeout_s is not None:
        changes["timeout_ms"] = int(body.timeout_s * 1000)
    if body.breaker_cooldown_s is not None:
        changes["breaker_cooldown_ms"] = int(body.breaker_cooldown_s * 1000)
    if body.disable_after_s is not None:
        changes["disable_after_ms"] = int(body.disable_after_s * 1000)
    if body.breaker_window_s is not None:
        changes["breaker_window_ms"] = int(body.breaker_window_s * 1000)
    reveal = False
    if body.secret is not None or body.rotate_secret:
        if body.secret is not None and body.rotate_secret:
            raise InvalidRequest("give secret or rotate_secret, not both")
        fresh = validate_secret(body.secret) if body.secret is not None else new_secret()
        changes["secrets"] = (fresh, current.secrets[0])
        reveal = True
    elif body.end_rotation:
        changes["secrets"] = current.secrets[:1]
    updated = await asyncio.to_thread(store.update, name, **changes)
    return updated.public(reveal_secret=reveal)


@router.delete("/{name}", status_code=204, responses=_ERRORS)
async def delete_subscription(name: str, broker: BrokerDep, store: StoreDep) -> Response:
    await asyncio.to_thread(store.delete, name)
    await asyncio.to_thread(LeaseTable(broker.layout, "api", 10).forget_group, name)
    await asyncio.to_thread(ReplayTable(broker.layout).forget, name)
    return Response(status_code=204)


@router.post("/{name}/pause", responses=_ERRORS)
async def pause(name: str, store: StoreDep) -> dict[str, Any]:
    return (await asyncio.to_thread(store.update, name, paused=True)).public()


@router.post("/{name}/resume", responses=_ERRORS)
async def resume(name: str, store: StoreDep) -> dict[str, Any]:
    """Resume a paused subscription, or re-enable a disabled one (by a 410 Gone, or failing past
    disable_after_s); delivery goes on from the group's position."""
    return (await asyncio.to_thread(store.update, name, paused=False, disabled_reason=None,
                                    failing_since=None)).public()


@router.post("/{name}/seek", responses=_ERRORS)
async def seek(name: str, body: SeekRequest, broker: BrokerDep, store: StoreDep) -> dict[str, Any]:
    """Move the group to offsets per partition, a timestamp, or earliest/latest. In-flight sends are dropped."""
    sub = await asyncio.to_thread(store.get, name)
    topic = broker.topic(sub.topic)
    given = [x for x in (body.to, body.timestamp, body.offsets) if x is not None]
    if len(given) != 1:
        raise InvalidRequest("give exactly one of to, timestamp or offsets")
    if body.offsets is not None:
        await broker.follow_ends(topic)
        files = await asyncio.to_thread(partition_files, broker.layout, topic)
        targets: dict[int, int] = {}
        for key, offset in body.offsets.items():
            if not (key.isascii() and key.isdigit()) or len(key) > 6:
                raise InvalidRequest(f"offsets keys are partition numbers, got {key!r}")
            p = int(key)
            topic.check_partition(p)
            low, high = log_start(files.get(p), broker.committed_end(topic, p)), broker.assigned_end(topic, p)
            if not low <= offset <= high:
                raise OutOfRange(f"offset {offset} is outside partition {p}: valid offsets are {low} to {high}")
            targets[p] = offset
    else:
        targets = await _targets(broker, topic, body.to or body.timestamp or "latest")
    updated = await asyncio.to_thread(store.update, name, seek_epoch=sub.seek_epoch + 1, seek_offsets=targets)
    leases = LeaseTable(broker.layout, "api", 10)
    # Partitions no worker holds are moved here; a worker holding one applies the seek itself.
    offsets = OffsetsTable(broker.layout)
    await asyncio.to_thread(offsets.commit, name, sub.topic, targets, OffsetReason.SEEK)
    await asyncio.to_thread(leases.record_seek, name, targets, updated.seek_epoch)
    return {"seek_epoch": updated.seek_epoch, "offsets": {str(p): o for p, o in targets.items()}}


@router.get("/{name}/dead-letters", responses=_ERRORS)
async def list_dead_letters(
    name: str, broker: BrokerDep, store: StoreDep,
    partition: int | None = Query(None, ge=0, le=MAX_PARTITIONS - 1), limit: int = Query(100, ge=1, le=10_000),
) -> dict[str, Any]:
    sub = await asyncio.to_thread(store.get, name)
    if partition is not None:
        broker.topic(sub.topic).check_partition(partition)
    rows = await asyncio.to_thread(DeadLetterTable(broker.layout).letters, name, limit=limit, partition=partition)
    for r in rows:
        for k in ("dead_at", "replay_requested_at", "replayed_at"):
            r[k] = r[k].isoformat() if r[k] is not None else None
    return {"dead_letters": rows}


@router.post("/{name}/dead-letters/replay", responses=_ERRORS)
async def replay_dead_letters(name: str, body: ReplayRequest, broker: BrokerDep, store: StoreDep) -> dict[str, int]:
    """Redeliver dead letters: one (partition + from_offset = to_offset), a range, or all (empty body)."""
    sub = await asyncio.to_thread(store.get, name)
    if (body.from_offset is not None or body.to_offset is not None) and body.partition is None:
        raise InvalidRequest("an offset range needs a partition")
    if body.partition is not None:
        broker.topic(sub.topic).check_partition(body.partition)
    requested = await asyncio.to_thread(DeadLetterTable(broker.layout).request_replay, name,
                                        partition=body.partition, from_offset=body.from_offset,
                                        to_offset=body.to_offset)
    return {"requested": requested}
