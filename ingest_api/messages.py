"""What a producer sends, and when it wants its answer: the broker's input, in a module light
enough for the CLI to import without the broker (numpy, the flusher, delta-rs)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class AckMode(StrEnum):
    NONE = "none"  # answered when queued; lost if the process dies before the fsync
    WAL = "wal"  # answered after the WAL fsync (the default)
    TABLE = "table"  # answered after the Delta commit


@dataclass(slots=True)
class NewMessage:
    value: bytes | None
    format: str = "text"
    key: str | None = None
    headers: dict[str, str] | None = None
    partition: int | None = None
    message_id: str | None = None
    producer_id: str | None = None
    sequence: int | None = None
