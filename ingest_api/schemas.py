"""Request and response bodies of the HTTP API, one model per direction."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tables.topics import MAX_PARTITIONS


class TopicCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)
    partitions: int | None = Field(None, ge=1, le=MAX_PARTITIONS)
    retention_ms: int | None = Field(7 * 24 * 3600 * 1000, gt=0)
    retention_bytes: int | None = Field(None, gt=0)
    cleanup_policy: Literal["delete", "compact"] = "delete"
    max_message_bytes: int | None = Field(None, ge=1, le=64 * 1024 * 1024)
    tombstone_retention_ms: int = Field(24 * 3600 * 1000, ge=0)


class TopicUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    partitions: int | None = Field(None, ge=1, le=MAX_PARTITIONS)
    retention_ms: int | None = Field(None, gt=0)
    retention_bytes: int | None = Field(None, gt=0)
    cleanup_policy: Literal["delete", "compact"] | None = None
    max_message_bytes: int | None = Field(None, ge=1, le=64 * 1024 * 1024)
    tombstone_retention_ms: int | None = Field(None, ge=0)


class PartitionPublic(BaseModel):
    partition: int
    log_start_offset: int
    log_end_offset: int = Field(description="Next offset to be assigned (includes messages still in the WAL).")
    committed_offset: int = Field(description="Offsets below this are committed to the Delta table.")
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
    partition_offsets: list[PartitionPublic] | None = None


class MessageIn(BaseModel):
    """One message. Give `value` (any JSON; a string is stored as text) or `value_b64` (raw bytes)."""

    model_config = ConfigDict(extra="forbid")
    key: str | None = Field(None, max_length=64 * 1024)
    value: Any = None
    value_b64: str | None = None
    headers: dict[str, str] | None = None
    partition: int | None = Field(None, ge=0)
    id: str | None = Field(None, min_length=1, max_length=256, description="Message id for deduplication.")
    producer_id: str | None = Field(None, min_length=1, max_length=256)
    sequence: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_value(self) -> MessageIn:
        if self.value_b64 is not None and self.value is not None:
            raise ValueError("give either value or value_b64, not both")
        if "value" not in self.model_fields_set and self.value_b64 is None:
            raise ValueError("value is required (JSON null is a tombstone); or give value_b64 for raw bytes")
        return self


class BatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[MessageIn] = Field(min_length=1, max_length=100_000)


class ProduceResultPublic(BaseModel):
    partition: int
    offset: int | None = Field(description="Null only with ack=none, before the offset is assigned.")
    duplicate: bool = False


class BatchResultPublic(BaseModel):
    results: list[ProduceResultPublic]


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


class MessagesPublic(BaseModel):
    messages: list[MessagePublic]
    next_offset: int
    log_start_offset: int
    committed_offset: int


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorPublic(BaseModel):
    error: ErrorBody
