"""Which node owns each partition, so the producer sends a message straight to its owner.

Any node of a lakebroker cluster takes any message and forwards it to its partition's owner, so a
producer that only knows one URL works; one that knows the owners saves that hop. The map comes
from GET /v1/cluster and is read again once MAX_AGE_S old, and (at most once a second) after a send
that went wrong (an owner that refused, 421 not_owner, or did not answer) or that a node forwarded
to the owner (its answer names the owners in `Lakebroker-Forwarded-To`: a partition moved since the
map was read). An owner that did not answer is avoided for `AVOID_S`; its messages go through the
producer's URL meanwhile.

A message's partition is computed here as the broker computes it: the explicit partition, else
Kafka's murmur2 of the key, else of the message's id (the producer gives every message one). Both
sides hash the same bytes, so the message goes to the node that will take it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

REFRESH_AFTER_S = 1.0  # at most one read of /v1/cluster a second, after a send that went wrong
MAX_AGE_S = 30.0  # and one at least this often: nodes join, partitions move
AVOID_S = 30.0
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` (a signed 32-bit result), as its Java and C clients compute it."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    tail = length & ~3
    for i in range(0, tail, 4):
        k = (int.from_bytes(data[i: i + 4], "little") * _M) & _MASK
        k = ((k ^ (k >> 24)) * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h = ((h ^ data[tail]) * _M) & _MASK
    h = ((h ^ (h >> 13)) * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_of(route: str, partitions: int) -> int:
    """The partition of a key (or id) among `partitions`, as Kafka's default partitioner picks it."""
    return (murmur2(route.encode()) & 0x7FFFFFFF) % partitions


@dataclass
class ClusterMap:
    """The owners as the last read of /v1/cluster saw them."""

    partitions: dict[str, int] = field(default_factory=dict)  # topic -> partition count
    owners: dict[tuple[str, int], str] = field(default_factory=dict)  # (topic, partition) -> owner URL
    nodes: int = 0


class Router:
    def __init__(self, fetch: Any) -> None:
        """`fetch()`: the /v1/cluster answer as parsed JSON (raises on failure)."""
        self._fetch = fetch
        self._lock = threading.Lock()
        self._map = ClusterMap()
        self._read_at = -REFRESH_AFTER_S
        self._avoid: dict[str, float] = {}  # owner URL -> monotonic time until which it is not tried

    def refresh(self, *, force: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            if not force and now - self._read_at < REFRESH_AFTER_S:
                return
            self._read_at = now
        try:
            answer = self._fetch()
        except Exception:  # noqa: BLE001 - no map: everything goes through the producer's URL
            return
        counts: dict[str, int] = {}
        owners: dict[tuple[str, int], str] = {}
        for p in answer.get("partitions", []):
            counts[p["topic"]] = max(counts.get(p["topic"], 0), p["partition"] + 1)
            if p.get("url"):
                owners[(p["topic"], p["partition"])] = p["url"].rstrip("/")
        with self._lock:
            self._map = ClusterMap(counts, owners, sum(1 for n in answer.get("nodes", []) if n.get("alive")))

    def owner(self, topic: str, partition: int | None, route: str | None) -> str | None:
        """The URL to send this message to; None: the producer's own URL (one node, an unknown
        topic or owner, an owner being avoided)."""
        if time.monotonic() - self._read_at > MAX_AGE_S:
            self.refresh()
        cluster = self._map
        if cluster.nodes < 2:
            return None
        count = cluster.partitions.get(topic)
        if count is None:
            return None
        if partition is None:
            if route is None:
                return None
            partition = partition_of(route, count)
        url = cluster.owners.get((topic, partition))
        if url is None or self._avoid.get(url, 0.0) > time.monotonic():
            return None
        return url

    def avoid(self, url: str) -> None:
        self._avoid[url] = time.monotonic() + AVOID_S
