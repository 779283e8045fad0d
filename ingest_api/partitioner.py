"""Key → partition, exactly as Kafka's default partitioner does it.

`toPositive(murmur2(utf8(key))) % partitions`, so a keyed message lands where a Kafka client
with a StringSerializer would put it. Keyless messages go round-robin per topic.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: a signed 32-bit result."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    tail = length & ~3
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def _positive_hash(key: str) -> int:
    return murmur2(key.encode()) & 0x7FFFFFFF


def partition_for_key(key: str, partitions: int) -> int:
    return _positive_hash(key) % partitions


class RoundRobin:
    """Spreads keyless messages evenly over a topic's partitions."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def next(self, partitions: int) -> int:
        return next(self._counter) % partitions
