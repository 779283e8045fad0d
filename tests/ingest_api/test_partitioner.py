from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from lakebroker.ingest_api.partitioner import MIN_RUN_BYTES, KeyCache, RoundRobin, murmur2, partition_for_key
from lakebroker.ingest_api.records import RECORD_OVERHEAD

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


def _sized(*sizes: int) -> np.ndarray:
    """Messages of these sizes (key, value and headers bytes)."""
    return np.array(sizes, np.int64)


def _run_bytes(messages: int) -> int:
    """A message size at which `messages` of them make one MIN_RUN_BYTES run."""
    return -(-MIN_RUN_BYTES // messages) - RECORD_OVERHEAD


def test_a_request_of_one_keyless_message_is_plain_round_robin() -> None:
    a, b = RoundRobin(), RoundRobin()
    assert [a.next(3) for _ in range(7)] == [int(b.take(_sized(10), 3)[0]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_a_batch_under_two_runs_stays_on_one_partition_and_the_next_request_moves_on() -> None:
    rr = RoundRobin()
    five_thousand = np.full(5000, 100, np.int64)  # ~800 KB with the per-message overhead: one run
    assert rr.take(five_thousand, 4).tolist() == [0] * 5000  # Kafka's sticky partitioner keeps a batch together
    almost_two = np.full(199, _run_bytes(100))  # 1.99 runs' worth: still one
    assert rr.take(almost_two, 4).tolist() == [1] * 199
    assert rr.next(4) == 2


def test_a_large_batch_is_one_run_per_partition_of_nearly_equal_bytes() -> None:
    rr = RoundRobin()
    rr.next(3)
    size = _run_bytes(1000)  # 1,000 of them make a run
    placed = rr.take(np.full(5000, size), 3)  # five runs' worth over three partitions: three runs
    starts = np.flatnonzero(np.diff(placed)) + 1
    assert placed[np.concatenate(([0], starts))].tolist() == [1, 2, 0]  # consecutive, from the next partition
    assert sorted(Counter(placed.tolist()).values()) == [1666, 1667, 1667]
    assert rr.take(np.full(2000, size), 3).tolist() == [1] * 1000 + [2] * 1000  # three runs used: starts at 1 again
    assert rr.take(np.full(10_000, size), 64)[::1000].tolist() == list(range(6, 16))  # fewer runs than partitions


def test_runs_are_cut_by_bytes_not_by_messages() -> None:
    rr = RoundRobin()
    assert set(rr.take(np.full(14_000, 10), 3).tolist()) == {0}, "14,000 small messages are one run's worth"
    placed = rr.take(_sized(2 * MIN_RUN_BYTES, 10, 10, 10), 3)  # two runs' worth, nearly all in one message
    assert placed.tolist() == [1, 2, 2, 2]


def test_key_cache_answers_as_the_per_key_function_across_batches_and_resets() -> None:
    cache = KeyCache(7, max_keys=50)
    for batch in (["a", "b", "a"], [f"user-{i}" for i in range(40)], ["b", "ü", "", "c"] * 3,
                  [f"k{i}" for i in range(120)], ["a", "k3"]):
        keys = pa.array(batch, pa.string())
        assert cache.lookup(keys).tolist() == [partition_for_key(k, 7) for k in batch]
