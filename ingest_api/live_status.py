"""What the ingest app is handed by whoever composes it (`lakebroker/server.py`): services to run
beside it, and the live status of the delivery pipelines among them. The app shows that status;
it never imports the delivery package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class PartitionStatus(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


class LiveStatus(Protocol):
    def status(self, name: str) -> Mapping[int, PartitionStatus]:
        """Per partition, the live status of a subscription's pipelines that this process runs;
        the others report theirs through the leases table."""
        ...


class Service(Protocol):
    """Started once the app holds the data-dir lock and has recovered; stopped at shutdown (also
    when it never started)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
