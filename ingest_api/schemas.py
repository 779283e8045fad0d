"""Request and response bodies of the HTTP API, one model per direction."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lakebroker.tables.layout import validate_name
from lakebroker.tables.topics import MAX_PARTITIONS, TopicConfig, new_topic

# The largest integer every JSON parser keeps exact (JavaScript's Number.MAX_SAFE_INTEGER); the
# tables store int64, and a bound above 2**53 cannot even be checked exactly by a float-based
# JSON Schema validator.
MAX_INT = 2**53 - 1
# The names of a partition's ends (docs/concepts.md#offsets): `log_end_offset` the next offset to
# assign, `high_watermark` the end committed to Delta, `committed_offset` a consumer group's position.
DEPRECATED_END = "the same as high_watermark, under its former name; removed in the next release."

# Standard base64 with padding, as value_b64 is decoded (the pattern documents it; the route checks).
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

# Input models are strict: true is not 1, "5" is not 5, and 5.0 is not an integer.


class TopicCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=128)
    partitions: int | None = Field(None, ge=1, le=MAX_PARTITIONS)
    retention_ms: int | None = Field(7 * 24 * 3600 * 1000, gt=0, le=MAX_INT, description="null: keep forever.")
    retention_bytes: int | None = Field(None, gt=0, le=MAX_INT, description="Per partition; null: no limit.")
    cleanup_policy: Literal["delete", "compact"] = "delete"
    max_message_bytes: int | None = Field(None, ge=1, le=64 * 1024 * 1024)
    tombstone_retention_ms: int = Field(24 * 3600 * 1000, ge=0, le=MAX_INT)

    def topic(self, default_partitions: int, default_max_message_bytes: int) -> TopicConfig:
        """The new topic's configuration, the broker's defaults filling what was not given."""
        validate_name(self.name)
        fields = self.model_dump(exclude={"name", "partitions"})
        if fields["max_message_bytes"] is None:
            fields["max_message_bytes"] = default_max_message_bytes
        return new_topic(self.name, self.partitions or default_partitions, **fields)


class TopicUpdate(BaseModel):
    """Only the fields given change. retention_ms and retention_bytes take null (no limit); the
    others cannot be null (the None defaults only mark them as not given)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    partitions: int = Field(None, ge=1, le=MAX_PARTITIONS, description="Can only grow.")  # type: ignore[assignment]
    retention_ms: int | None = Field(None, gt=0, le=MAX_INT)
    retention_bytes: int | None = Field(None, gt=0, le=MAX_INT)
    cleanup_policy: Literal["delete", "compact"] = Field(None)  # type: ignore[arg-type]
    max_message_bytes: int = Field(None, ge=1, le=64 * 1024 * 1024)  # type: ignore[assignment]
    tombstone_retention_ms: int = Field(None, ge=0, le=MAX_INT)  # type: ignore[assignment]


class PartitionPublic(BaseModel):
    partition: int
    log_start_offset: int
    log_end_offset: int = Field(description="Next offset to be assigned (includes messages still in the WAL).")
    high_watermark: int = Field(description="Offsets below this are committed to the Delta table: what reads see.")
    committed_offset: int = Field(description=f"Deprecated: {DEPRECATED_END}", json_schema_extra={"deprecated": True})
    size_bytes: int
    files: int


class TopicPublic(BaseModel):
    name: str
    topic_id: str
    partitions: int
    retention_ms: int | None
    retention_bytes: int | None
    cleanup_policy: str
    max_message_bytes: int
    tombstone_retention_ms: int
    created_at: str
    location: str = Field(description="The topic's Delta table, relative to the table root: `topics/<name>`, "
                          "or a path of its own for a topic created again under a deleted topic's name.")
    partition_offsets: list[PartitionPublic] | None = None


class MessageIn(BaseModel):
    """One message. Give `value` (any JSON; a string is stored as text) or `value_b64` (raw bytes)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [  # what _one_value checks
        {"required": ["value"], "properties": {"value_b64": {"type": "null"}}},
        {"required": ["value_b64"], "properties": {"value_b64": {"type": "string"}, "value": {"type": "null"}}},
    ]})
    key: str | None = Field(None, max_length=64 * 1024)
    value: Any = None
    value_b64: str | None = Field(None, json_schema_extra={"pattern": BASE64_PATTERN, "contentEncoding": "base64"})
    headers: dict[str, str] | None = None
    partition: int | None = Field(None, ge=0, le=MAX_PARTITIONS - 1)
    id: str | None = Field(None, min_length=1, max_length=256, description="Message id for deduplication.")
    producer_id: str | None = Field(None, min_length=1, max_length=256)
    sequence: int | None = Field(None, ge=0, le=MAX_INT)

    @model_validator(mode="after")
    def _one_value(self) -> MessageIn:
        if self.value_b64 is not None and self.value is not None:
            raise ValueError("give either value or value_b64, not both")
        if "value" not in self.model_fields_set and self.value_b64 is None:
            raise ValueError("value is required (JSON null is a tombstone); or give value_b64 for raw bytes")
        return self


class BatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    messages: list[MessageIn] = Field(min_length=1, max_length=100_000)


class ProduceResultPublic(BaseModel):
    partition: int
    offset: int | None = Field(description="Null only with ack=none, before the offset is assigned.")
    duplicate: bool = False


class BatchItemPublic(ProduceResultPublic):
    timestamp: str | None = Field(description="Log-append time (ISO 8601, UTC); null only with ack=none.")


class BatchResultPublic(BaseModel):
    results: list[BatchItemPublic]


class MessagePublic(BaseModel):
    partition: int
    offset: int
    timestamp: str
    key: str | None
    value: Any
    value_b64: str | None = None
    format: str
    headers: dict[str, str] | None
    id: str | None = None
    producer_id: str | None = None
    sequence: int | None = None


class LostRangePublic(BaseModel):
    first_offset: int
    last_offset: int


class MessagesPublic(BaseModel):
    messages: list[MessagePublic]
    next_offset: int
    log_start_offset: int
    high_watermark: int = Field(description="Offsets below this are committed to the Delta table: a read "
                                            "reaches them.")
    committed_offset: int = Field(description=f"Deprecated: {DEPRECATED_END}", json_schema_extra={"deprecated": True})
    lost_offsets: list[LostRangePublic] = Field(
        default_factory=list,
        description="Offsets in the range read that were lost to WAL damage and skipped by an operator "
                    "(`lakebroker wal skip`): an explicit gap, never a silent one.")


class WalSkip(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    topic: str = Field(min_length=1, max_length=128)
    partition: int = Field(ge=0)


class WalDamagePublic(BaseModel):
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    lost: int
    wal_damage: str


class LostOffsetsPublic(BaseModel):
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    wal_damage: str
    skipped_at: str
    skipped_by: str


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorPublic(BaseModel):
    error: ErrorBody


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with nested models written out in place, for `openapi_extra`.

    FastAPI puts only the models it sees in signatures into `components`, and a `$defs` reference
    would resolve against the root of the OpenAPI document: either way it would dangle.
    """
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    out: dict[str, Any] = inline(schema)
    return out


class NodePublic(BaseModel):
    id: str
    url: str = Field(description="The node's advertised URL.")
    since: str = Field(description="When the node first joined the cluster.")
    lease_expires_at: str = Field(description="Its partitions move to live nodes after this, unless it heartbeats.")
    alive: bool
    draining: bool = Field(False, description="Stopping: no partition is given to it, and those it holds move on "
                                              "once it stops.")
    kafka: str | None = Field(None, description="Its Kafka listener's advertised host:port (null: none).")


class PartitionOwnerPublic(BaseModel):
    topic: str
    partition: int
    owner: str | None = Field(description="The owning node's id; null while the partition changes hands.")
    url: str | None = Field(description="The owner's advertised URL: where to send this partition's messages.")
    epoch: int = Field(description="Bumped at each change of owner; the owner's table commits carry it.")
    since: str | None = Field(description="When the owner took the partition.")


class ClusterPublic(BaseModel):
    node: str = Field(description="The id of the node that answered.")
    nodes: list[NodePublic]
    partitions: list[PartitionOwnerPublic]
