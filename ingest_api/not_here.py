"""What a produce gets for a partition this node does not take now: the owner's address to retry
at, or, while the partition is between owners, a 503 to retry in a moment."""

from __future__ import annotations

from lakebroker.tables.errors import Backpressure, LakebrokerError


class NotOwner(LakebrokerError):
    """A produce reached a node that does not own the message's partition."""

    status = 421  # Misdirected Request: the client may retry at the owner
    code = "not_owner"

    def __init__(self, message: str, partition: int, owner_url: str | None) -> None:
        super().__init__(message)
        self.partition = partition
        self.owner_url = owner_url


class NoOwnerYet(Backpressure):
    """A produce for a partition between owners (a node died, or it is being handed over)."""

    status = 503
    code = "partition_unavailable"
