"""Key → partition, exactly as Kafka's default partitioner does it.

`toPositive(murmur2(utf8(key))) % partitions`, so a keyed message lands where a Kafka client
with a StringSerializer would put it. Keyless messages go round-robin per topic.

`partitions_for` does the same for a whole columnar batch: the hash runs once per distinct
key (keys repeat), and the round-robin takes a block of the counter.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
        self._counter = 0

    def next(self, partitions: int) -> int:
        n = self._counter
        self._counter = n + 1
        return n % partitions

    def take(self, count: int, partitions: int) -> np.ndarray:
        """What `count` calls of next() would answer, in order."""
        first = self._counter
        self._counter = first + count
        return np.arange(first, first + count, dtype=np.int64) % partitions


def partitions_for(explicit: pa.Array, keys: pa.Array, partitions: int, round_robin: RoundRobin) -> np.ndarray:
    """Each message's partition, as `_partition` in broker.py picks it one at a time: the
    explicit partition, else the key's, else the next round-robin one."""
    out: np.ndarray = pc.fill_null(explicit, -1).to_numpy(zero_copy_only=False).astype(np.int32)
    free = out < 0
    if not free.any():
        return out
    keyed = free & pc.is_valid(keys).to_numpy(zero_copy_only=False)
    if keyed.any():
        encoded = pc.dictionary_encode(keys.filter(pa.array(keyed)))
        by_key = np.array([partition_for_key(k, partitions) for k in encoded.dictionary.to_pylist()], np.int32)
        out[keyed] = by_key[encoded.indices.to_numpy(zero_copy_only=False)]
    keyless = free & ~keyed
    if keyless.any():
        out[keyless] = round_robin.take(int(keyless.sum()), partitions)
    return out
