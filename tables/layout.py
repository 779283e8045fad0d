"""Where everything lives under the data dir, and which names are allowed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tables.errors import InvalidName

# Kafka's legal characters. A leading underscore is reserved for system tables, and the
# length keeps a table path well under any filesystem's name limit.
NAME_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # also the OpenAPI pattern of names
_NAME = re.compile(NAME_PATTERN)


def validate_name(name: str, what: str = "topic") -> str:
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidName(
            f"invalid {what} name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class Layout:
    data_dir: Path

    @property
    def wal_dir(self) -> Path:
        return self.data_dir / "wal"

    @property
    def lock_file(self) -> Path:
        return self.data_dir / ".lakebroker.lock"

    @property
    def server_file(self) -> Path:
        """Written by `serve` so CLI commands can reach the running broker."""
        return self.data_dir / "server.json"

    @property
    def topics_root(self) -> Path:
        return self.data_dir / "topics"

    def topic_table(self, topic: str) -> str:
        return str((self.topics_root / validate_name(topic)).resolve())

    @property
    def system_root(self) -> Path:
        return self.data_dir / "_system"

    @property
    def topics_table(self) -> str:
        return str((self.system_root / "topics").resolve())

    @property
    def tokens_table(self) -> str:
        return str((self.system_root / "tokens").resolve())

    @property
    def offsets_table(self) -> str:
        return str((self.system_root / "consumer_offsets").resolve())

    @property
    def dead_letters_table(self) -> str:
        return str((self.system_root / "dead_letters").resolve())

    @property
    def job_runs_table(self) -> str:
        """One row per maintenance-job run and table (spark_pipeline/job_runs.py)."""
        return str((self.system_root / "job_runs").resolve())

    @property
    def retention_skips_table(self) -> str:
        """Every time retention moved a consumer group past messages it had not delivered."""
        return str((self.system_root / "retention_skips").resolve())

    @property
    def subscriptions_table(self) -> str:
        return str((self.system_root / "subscriptions").resolve())

    @property
    def leases_table(self) -> str:
        return str((self.system_root / "delivery_leases").resolve())
