from collections import Counter

import pyarrow as pa
import pytest

from ingest_api.partitioner import KeyCache, RoundRobin, murmur2, partition_for_key

# The vectors of Kafka's own UtilsTest.testMurmur2.
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_partition_is_kafka_to_positive_mod() -> None:
    for data, expected in KAFKA_VECTORS:
        for n in (1, 3, 7, 64):
            assert partition_for_key(data.decode(), n) == (expected & 0x7FFFFFFF) % n


def test_round_robin_spreads_evenly() -> None:
    rr = RoundRobin()
    counts = Counter(rr.next(4) for _ in range(400))
    assert counts == {0: 100, 1: 100, 2: 100, 3: 100}


def test_key_cache_answers_as_the_per_key_function_across_batches_and_resets() -> None:
    cache = KeyCache(7, max_keys=50)
    for batch in (["a", "b", "a"], [f"user-{i}" for i in range(40)], ["b", "ü", "", "c"] * 3,
                  [f"k{i}" for i in range(120)], ["a", "k3"]):
        keys = pa.array(batch, pa.string())
        assert cache.lookup(keys).tolist() == [partition_for_key(k, 7) for k in batch]
