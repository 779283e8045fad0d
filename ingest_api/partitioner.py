"""Key → partition, exactly as Kafka's default partitioner does it.

`toPositive(murmur2(utf8(key))) % partitions`, so a keyed message lands where a Kafka client
with a StringSerializer would put it.

A keyless message that carries an id (`id`, or `producer_id` with `sequence`) goes to the
partition its dedup id hashes to, the same way: a retry sent through any node of a cluster then
reaches the partition, and the node, that saw the first attempt, which answers it as a duplicate.

Other keyless messages go round-robin per topic in runs, as Kafka's sticky partitioner (KIP-480,
KIP-794) keeps a batch of `batch.size` bytes on one partition: a request's keyless messages are cut
into consecutive runs of about equal bytes, at least `MIN_RUN_BYTES` each, at most one per
partition, and the next run starts on the next partition. A request under twice that is one run,
so single-message requests go plain round-robin and a batch stays on one partition; a larger batch
spreads evenly. Each run becomes one WAL chunk, whose fixed costs (an Arrow IPC stream, a
future, a slice of a Delta commit) a run of a MiB makes small.

`partitions_for` does the same for a whole columnar batch: keys seen before are looked up in
a per-topic cache by Arrow (a hash lookup in C), and the hash runs once per new key.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.ingest_api.dedup import spread_id
from lakebroker.ingest_api.messages import NewMessage
from lakebroker.ingest_api.records import RECORD_OVERHEAD
from lakebroker.tables.topics import TopicConfig

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


MIN_RUN_BYTES = 1024 * 1024  # Kafka's batch.size, larger: a run's fixed costs are larger here


class RoundRobin:
    """Spreads keyless messages over a topic's partitions, one run of a request at a time."""

    def __init__(self) -> None:
        self._runs = 0
        # In a cluster, the partitions this node owns (keyless messages need no hop to another
        # node, as Kafka's sticky partitioner favours a ready broker); None: every partition.
        self.choices: np.ndarray | None = None

    def next(self, partitions: int) -> int:
        """The partition of a request's only keyless message: `take(its size, partitions)[0]`."""
        n = self._runs
        self._runs = n + 1
        choices = self.choices
        return n % partitions if choices is None else int(choices[n % len(choices)])

    def take(self, sizes: np.ndarray, partitions: int) -> np.ndarray:
        """The partitions of one request's keyless messages of these `sizes` (bytes, as
        records.message_bytes counts them), in order: up to one run per partition, of about equal
        bytes, each of at least MIN_RUN_BYTES (all of them if fewer)."""
        choices = self.choices
        width = partitions if choices is None else len(choices)
        weights = sizes.astype(np.int64) + RECORD_OVERHEAD  # as the WAL and the backlog count a message
        total = int(weights.sum())
        runs = max(1, min(width, total // MIN_RUN_BYTES))
        first = self._runs
        self._runs = first + runs
        if runs == 1:
            spread = np.full(len(sizes), first % width, np.int64)
        else:  # a message belongs to the run its first byte falls in
            spread = (first + (np.cumsum(weights) - weights) * runs // total) % width
        return spread if choices is None else choices[spread]


class KeyCache:
    """Key → partition for one topic at one partition count, over whole arrays of keys."""

    def __init__(self, partitions: int, max_keys: int = 1 << 16) -> None:
        self.partitions = partitions
        self.max_keys = max_keys
        self._keys = pa.array([], pa.string())
        self._partitions = np.empty(0, np.int32)

    def lookup(self, keys: pa.Array) -> np.ndarray:
        """The partition of each (non-null) key."""
        at = pc.index_in(keys, value_set=self._keys)
        if at.null_count:
            new = pc.unique(keys.filter(pc.is_null(at)))
            if len(self._keys) + len(new) > self.max_keys:  # keys that stop repeating: keep this batch's only
                self._keys, self._partitions = pa.array([], pa.string()), np.empty(0, np.int32)
                new = pc.unique(keys)
            hashed = np.array([partition_for_key(k, self.partitions) for k in new.to_pylist()], np.int32)
            self._keys = pa.concat_arrays([self._keys, new])
            self._partitions = np.concatenate([self._partitions, hashed])
            at = pc.index_in(keys, value_set=self._keys)
        found: np.ndarray = self._partitions[at.to_numpy(zero_copy_only=False)]
        return found


def partitions_for(explicit: pa.Array, keys: pa.Array, sizes: np.ndarray, round_robin: RoundRobin,
                   cache: KeyCache) -> np.ndarray:
    """Each message's partition, as `Partitioner.each` picks it per message: the explicit
    partition, else the key's, else its place in the request's keyless runs."""
    partitions = cache.partitions
    n = len(explicit)
    if not keys.null_count and explicit.null_count == n:  # every message keyed: no mask to build
        return cache.lookup(keys)
    if explicit.null_count == n and keys.null_count == n:  # every message keyless
        return round_robin.take(sizes, partitions).astype(np.int32)
    out: np.ndarray = pc.fill_null(explicit, -1).to_numpy(zero_copy_only=False).astype(np.int32)
    free = out < 0
    if not free.any():
        return out
    keyed = free & pc.is_valid(keys).to_numpy(zero_copy_only=False)
    if keyed.any():
        out[keyed] = cache.lookup(keys.filter(pa.array(keyed)))
    keyless = free & ~keyed
    if keyless.any():
        out[keyless] = round_robin.take(sizes[keyless], partitions)
    return out


class Partitioner:
    """Partition choice for every produce shape, with each topic's keyless runs and key cache: the
    explicit partition, else the key's (Kafka's murmur2), else the request's place in the keyless
    runs. A duplicate is given a partition too, before the dedup check, so it takes its turn in
    the keyless runs on every path alike."""

    def __init__(self) -> None:
        self._round_robin: dict[str, RoundRobin] = {}  # by topic name
        self._key_caches: dict[str, KeyCache] = {}  # by topic id

    def one(self, topic: TopicConfig, m: NewMessage) -> int:
        """The partition of a request's only message."""
        if m.partition is not None:
            return m.partition
        if m.key is not None:
            return partition_for_key(m.key, topic.partitions)
        if m.message_id is not None or m.producer_id is not None:
            did = spread_id(m.message_id, m.producer_id, m.sequence)
            if did is not None:
                return partition_for_key(did, topic.partitions)
        return self._keyless(topic).next(topic.partitions)

    def each(self, topic: TopicConfig, messages: Sequence[NewMessage], sizes: Sequence[int]) -> list[int]:
        """The partitions of one request's messages, as `columns` picks them (`sizes`: each
        message's, as Admission.check returns them)."""
        if len(messages) == 1:
            return [self.one(topic, messages[0])]
        n = topic.partitions
        spread: dict[int, int] = {}
        keyless = []
        for i, m in enumerate(messages):
            if m.partition is None and m.key is None:
                did = spread_id(m.message_id, m.producer_id, m.sequence)
                if did is None:
                    keyless.append(i)
                else:
                    spread[i] = partition_for_key(did, n)
        if keyless:
            runs = self._keyless(topic).take(np.array([sizes[i] for i in keyless], np.int64), n)
            spread.update(zip(keyless, runs.tolist(), strict=True))
        return [m.partition if m.partition is not None else
                partition_for_key(m.key, n) if m.key is not None else spread[i]
                for i, m in enumerate(messages)]

    def columns(self, topic: TopicConfig, explicit: pa.Array, keys: pa.Array, sizes: np.ndarray,
                ids: pa.Array | None = None) -> np.ndarray:
        """The partitions of a batch held as columns (`sizes`: each message's, as message_bytes
        counts it; `ids`: what spreads keyless messages with an id (dedup.spread_ids), null where none)."""
        cache = self._key_caches.get(topic.topic_id)
        if cache is None or cache.partitions != topic.partitions:
            cache = self._key_caches[topic.topic_id] = KeyCache(topic.partitions)
        if ids is not None and ids.null_count < len(ids):  # keyless messages with an id go by the id
            keys = pc.if_else(pc.is_valid(keys), keys, ids)
        return partitions_for(explicit, keys, sizes, self._keyless(topic), cache)

    def restrict(self, topic: TopicConfig, owned: list[int]) -> None:
        """Keyless messages of `topic` go to `owned` only (all partitions when it is empty or all)."""
        choices = None if len(owned) in (0, topic.partitions) else np.array(sorted(owned), np.int64)
        self._keyless(topic).choices = choices

    def forget(self, topic: TopicConfig) -> None:
        """The topic was deleted: a topic made again under its name starts afresh."""
        self._round_robin.pop(topic.name, None)
        self._key_caches.pop(topic.topic_id, None)

    def _keyless(self, topic: TopicConfig) -> RoundRobin:
        rr = self._round_robin.get(topic.name)
        if rr is None:
            rr = self._round_robin[topic.name] = RoundRobin()
        return rr
