"""Where everything lives (local state under the data dir, tables under the table root), and which names
are allowed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from lakebroker.tables import storage
from lakebroker.tables.errors import InvalidName

if TYPE_CHECKING:
    from lakebroker.tables.settings import Settings

# Kafka's legal characters. A leading underscore is reserved for system tables, and the
# length keeps a table path well under any filesystem's name limit.
NAME_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # also the OpenAPI pattern of names
_NAME = re.compile(NAME_PATTERN)


class Located(Protocol):
    @property
    def location(self) -> str: ...  # relative to the table root


def validate_name(name: str, what: str = "topic") -> str:
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidName(
            f"invalid {what} name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class Layout:
    """Local state lives under `data_dir`; the Delta tables under `tables_uri` (a local path or
    s3://bucket/prefix, tables/storage.py), which defaults to the data dir."""

    data_dir: Path
    tables_uri: str | None = None

    @classmethod
    def of(cls, settings: Settings, *, for_spark: bool = False) -> Layout:
        """The layout of a settings object; `for_spark` spells S3 locations as Hadoop's S3A wants them."""
        root = settings.tables_uri
        return cls(settings.data_dir, storage.spark_uri(root) if for_spark and root else root)

    @property
    def wal_dir(self) -> Path:
        return self.data_dir / "wal"

    @property
    def dedup_dir(self) -> Path:
        """The dedup index's ring file: scratch, rebuilt at every start (ingest_api/dedup.py)."""
        return self.data_dir / "dedup"

    @property
    def node_file(self) -> Path:
        """This data dir's node id in a cluster (ingest_api/cluster.py)."""
        return self.data_dir / "node_id"

    @property
    def lock_file(self) -> Path:
        return self.data_dir / ".lakebroker.lock"

    @property
    def server_file(self) -> Path:
        """Written by `serve` so CLI commands can reach the running broker."""
        return self.data_dir / "server.json"

    @property
    def tables_root(self) -> str:
        """Absolute path or URI under which `topics/` and `_system/` live."""
        return self.tables_uri or str(self.data_dir.resolve())

    @property
    def on_object_store(self) -> bool:
        return storage.is_s3(self.tables_root)

    @property
    def topics_root(self) -> str:
        return storage.join(self.tables_root, "topics")

    def topic_table(self, topic: str | Located) -> str:
        """A topic's Delta table: at its `location` (a TopicConfig), or, given a name, where a topic of
        that name is first created. A topic created again after a delete has a location of its own
        (tables/topics.py), so what runs against a topic takes its TopicConfig."""
        if isinstance(topic, str):
            return storage.join(self.topics_root, validate_name(topic))
        return storage.join(self.tables_root, topic.location)

    def retired_marker(self, topic: str) -> str:
        """A file whose presence says `topics/<topic>` once held a deleted topic: never used again."""
        return storage.join(self.system_root, "retired_topic_locations", validate_name(topic))

    @property
    def system_root(self) -> str:
        return storage.join(self.tables_root, "_system")

    def system_table(self, name: str) -> str:
        return storage.join(self.system_root, name)

    @property
    def topics_table(self) -> str:
        return self.system_table("topics")

    @property
    def tokens_table(self) -> str:
        return self.system_table("tokens")

    @property
    def offsets_table(self) -> str:
        return self.system_table("consumer_offsets")

    @property
    def dead_letters_table(self) -> str:
        return self.system_table("dead_letters")

    @property
    def job_runs_table(self) -> str:
        """One row per maintenance-job run and table (tables/job_runs.py)."""
        return self.system_table("job_runs")

    @property
    def retention_skips_table(self) -> str:
        """Every time retention moved a consumer group past messages it had not delivered."""
        return self.system_table("retention_skips")

    @property
    def lost_offsets_table(self) -> str:
        """Offsets lost to WAL damage that an operator skipped (`lakebroker wal skip`)."""
        return self.system_table("lost_offsets")

    @property
    def subscriptions_table(self) -> str:
        return self.system_table("subscriptions")

    @property
    def replays_table(self) -> str:
        return self.system_table("replays")

    @property
    def leases_table(self) -> str:
        return self.system_table("delivery_leases")

    @property
    def job_slots_table(self) -> str:
        """Which scheduler runs a maintenance job now, and when one last started (tables/job_slots.py)."""
        return self.system_table("job_slots")

    @property
    def owners_table(self) -> str:
        """Which ingest node owns which topic partition (tables/ownership.py)."""
        return self.system_table("partition_owners")
