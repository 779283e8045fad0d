"""The one typed settings object. Every field is also `LAKEBROKER_<FIELD>` in the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LAKEBROKER_", extra="forbid")

    # storage
    data_dir: Path = Field(Path("data"), description="Root of the WAL, the Delta tables and the lock file.")
    jars_dir: Path = Field(
        PROJECT_ROOT / ".cache" / "jars", description="Delta jars fetched at setup by scripts/fetch_jars.sh."
    )

    # serving
    host: str = Field("127.0.0.1", description="Address `lakebroker serve` binds.")
    port: int = Field(8080, ge=0, le=65535, description="Port `lakebroker serve` binds.")
    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Largest HTTP request body accepted.")

    # topics
    default_partitions: int = Field(3, ge=1, le=1024, description="Partitions of a topic created without a count.")
    default_max_message_bytes: int = Field(1024 * 1024, gt=0, description="Default per-topic message size limit.")

    # write-ahead log
    wal_segment_bytes: int = Field(64 * 1024 * 1024, gt=0, description="Size at which a WAL segment is rolled.")
    wal_fsync: bool = Field(True, description="fsync each WAL group commit; turn off only for throwaway data.")
    max_backlog_bytes: int = Field(
        512 * 1024 * 1024, gt=0, description="Unflushed WAL bytes above which produce answers 429."
    )

    # flusher
    flush_interval_ms: int = Field(100, gt=0, description="Longest a WAL record waits before its Delta commit.")
    flush_max_records: int = Field(200_000, gt=0, description="Records that trigger a Delta commit early.")
    flush_max_bytes: int = Field(64 * 1024 * 1024, gt=0, description="Bytes that trigger a Delta commit early.")

    # idempotent produce
    dedup_window_s: int = Field(3600, ge=0, description="How long a message id or producer sequence is remembered.")
    dedup_max_entries: int = Field(2_000_000, gt=0, description="Most ids remembered; the oldest are forgotten first.")

    # spark
    spark_master: str = Field("local[*]", description="Master URL for Spark jobs and `lakebroker sql`.")
    spark_driver_memory: str = Field("1g", description="Driver memory of Spark jobs.")

    # operator
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level of `serve`.")

    def ensure_dirs(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
