"""The dedup index: its answers, its eviction, its memory per entry, and its rebuild at start."""

from __future__ import annotations

import asyncio
import random
import time
import tracemalloc
from collections.abc import Iterator

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from lakebroker.ingest_api import create_app
from lakebroker.ingest_api.dedup import DedupIndex, DedupKey, Placed, dedup_id, dedup_ids, key_hash, key_hashes
from lakebroker.tables.settings import Settings

TOPIC = "5f1d0c2a9b8e4f7c8a6b3d2e1f0a9b8c"  # a topic id as the broker keys it (hex)


def now_us() -> int:
    return int(time.time() * 1_000_000)


def keys(n: int, start: int = 0) -> Iterator[DedupKey]:
    for i in range(start, start + n):
        yield TOPIC, f"m:order-{i:012d}"


def test_a_remembered_id_answers_its_placement_and_others_miss() -> None:
    index = DedupIndex(window_s=3600, max_entries=100)
    at = now_us()
    index.remember((TOPIC, "m:a"), (2, 41, at))
    assert index.lookup((TOPIC, "m:a")) == (2, 41, at)
    assert index.lookup((TOPIC, "m:b")) is None
    assert index.lookup(("0" * 32, "m:a")) is None, "the same id in another topic is another message"
    assert index.lookup((TOPIC, "p:a")) is None
    assert len(index) == 1


def test_remembering_an_id_again_updates_it() -> None:
    index = DedupIndex(window_s=3600, max_entries=100)
    at = now_us()
    index.remember((TOPIC, "m:a"), (0, 1, at))
    index.remember((TOPIC, "m:a"), (3, 9, at + 5))
    assert index.lookup((TOPIC, "m:a")) == (3, 9, at + 5)
    assert len(index) == 1


def test_ids_that_do_not_encode_as_utf8_are_still_keys() -> None:
    index = DedupIndex(window_s=3600, max_entries=100)
    index.remember((TOPIC, "m:\ud800"), (0, 1, now_us()))  # a lone surrogate, as json.loads allows
    assert index.lookup((TOPIC, "m:\ud800")) is not None
    assert index.lookup((TOPIC, "m:\ud801")) is None


def test_an_id_in_flight_answers_its_future_until_it_is_remembered_or_abandoned() -> None:
    loop = asyncio.new_event_loop()
    try:
        index = DedupIndex(window_s=3600, max_entries=100)
        sent: asyncio.Future[Placed] = loop.create_future()
        index.begin((TOPIC, "m:a"), sent)
        assert index.lookup((TOPIC, "m:a")) is sent
        assert len(index) == 0, "only placed messages count"
        index.remember((TOPIC, "m:a"), (1, 2, now_us()))
        assert isinstance(index.lookup((TOPIC, "m:a")), tuple)
        failed: asyncio.Future[Placed] = loop.create_future()
        index.begin((TOPIC, "m:b"), failed)
        index.abandon((TOPIC, "m:b"))
        assert index.lookup((TOPIC, "m:b")) is None, "a send that failed is accepted afresh"
        index.abandon((TOPIC, "m:never-begun"))
    finally:
        loop.close()


def test_ids_older_than_the_window_are_forgotten_oldest_first() -> None:
    index = DedupIndex(window_s=60, max_entries=100)
    old, fresh = now_us() - 120_000_000, now_us()
    index.remember((TOPIC, "m:old-1"), (0, 0, old))
    index.remember((TOPIC, "m:old-2"), (0, 1, old))
    index.remember((TOPIC, "m:new"), (0, 2, fresh))
    assert index.lookup((TOPIC, "m:old-1")) is None and index.lookup((TOPIC, "m:old-2")) is None
    assert index.lookup((TOPIC, "m:new")) == (0, 2, fresh)
    assert len(index) == 1


def test_the_oldest_ids_are_forgotten_beyond_max_entries() -> None:
    index = DedupIndex(window_s=3600, max_entries=3)
    at = now_us()
    for i, key in enumerate(keys(5)):
        index.remember(key, (0, i, at))
    assert len(index) == 3
    found = [index.lookup(key) for key in keys(5)]
    assert found[:2] == [None, None]
    assert found[2:] == [(0, 2, at), (0, 3, at), (0, 4, at)]


def test_the_index_grows_and_wraps_around_over_many_inserts() -> None:
    index = DedupIndex(window_s=3600, max_entries=5_000)
    at = now_us()
    for i, key in enumerate(keys(60_000)):
        index.remember(key, (i % 7, i, at + i))
        if i % 9_973 == 0:  # now and then, every live id and a sample of the forgotten
            live = range(max(0, i - 4_999), i + 1)
            pairs = zip(live, keys(len(live), live.start), strict=True)
            assert all(index.lookup(k) == (j % 7, j, at + j) for j, k in pairs)
            assert all(index.lookup(k) is None for k in keys(min(live.start, 500)))
    assert len(index) == 5_000
    assert all(index.lookup(k) is None for k in keys(55_000))
    assert all(index.lookup(k) is not None for k in keys(5_000, 55_000))


def test_reserving_room_keeps_a_ring_that_wraps_around() -> None:
    index = DedupIndex(window_s=60, max_entries=100_000)
    for i, k in enumerate(keys(300, 1_000_000)):  # each expired as it comes: the ring's tail moves on
        index.remember(k, (0, i, now_us() - 120_000_000))
    at = now_us()
    for i, k in enumerate(keys(1_000)):  # ring positions 300..1023 then 0..275
        index.remember(k, (0, i, at))
    index.reserve(5_000)
    index.reserve(10)  # never shrinks
    assert len(index) == 1_000
    assert all(index.lookup(k) == (0, i, at) for i, k in enumerate(keys(1_000)))
    for i, k in enumerate(keys(4_500, 1_000)):
        index.remember(k, (0, 1_000 + i, at))
    assert all(index.lookup(k) == (0, i, at) for i, k in enumerate(keys(5_500)))


def test_ids_whose_probe_runs_wrap_past_the_slot_tables_end_survive_growth_and_eviction() -> None:
    """Five ids homed in the last slot, before and after the growth from 1,024 ids (2,048 slots)
    to 2,048 (4,096 slots): their run wraps to the table's start, and they are evicted first."""
    at = now_us()
    wrapping = [k for k in (("f" * 32, f"m:w{i}") for i in range(200_000)) if key_hash(k)[0] & 4095 == 4095][:5]
    assert len(wrapping) == 5
    index = DedupIndex(window_s=3600, max_entries=2_048)
    for i, k in enumerate(wrapping):
        index.remember(k, (1, i, at))
    for i, k in enumerate(keys(1_100)):  # the 1,025th id grows the table
        index.remember(k, (0, i, at))
    assert [index.lookup(k) for k in wrapping] == [(1, i, at) for i in range(5)]
    assert all(index.lookup(k) == (0, i, at) for i, k in enumerate(keys(1_100)))
    for i, k in enumerate(keys(955, 1_100)):  # 2,060 in all: the wrapping five and 7 more go
        index.remember(k, (0, 1_100 + i, at))
    assert len(index) == 2_048
    assert all(index.lookup(k) is None for k in wrapping)
    assert all(index.lookup(k) is None for k in keys(7))
    assert all(index.lookup(k) == (0, i, at) for i, k in enumerate(keys(2_055)) if i >= 7)


@pytest.mark.parametrize(("max_entries", "distinct", "steps"), [(300, 1_000, 200_000), (3_000, 8_000, 100_000)])
def test_the_index_answers_as_an_ordered_dict_does_over_random_operations(max_entries: int, distinct: int,
                                                                          steps: int) -> None:
    """Few ids, a small max_entries and ids that expire: probing, deletion and the ring's
    wrap-around all run many times (and in the second case, growth from 1,024 to 3,000)."""
    rng = random.Random(31)
    window_s = 3600
    index = DedupIndex(window_s=window_s, max_entries=max_entries)
    model: dict[DedupKey, Placed] = {}  # insertion order = the index's age order; an update keeps its place
    fresh, expired = now_us(), now_us() - 2 * window_s * 1_000_000
    ids = [(rng.choice((TOPIC, "0" * 32)), f"p:{rng.randrange(50)}:{n}") for n in range(distinct)]
    for step in range(steps):
        key = rng.choice(ids)
        if rng.random() < 0.5:
            assert index.lookup(key) == model.get(key), f"step {step}"
            continue
        placed = (rng.randrange(8), step, expired if rng.random() < 0.02 else fresh + step)
        index.remember(key, placed)
        model[key] = placed
        while model:
            head = next(iter(model))
            if model[head][2] >= fresh and len(model) <= max_entries:
                break
            del model[head]
        assert len(index) == len(model), f"step {step}"
    assert all(index.lookup(key) == model.get(key) for key in ids)


def test_an_entry_takes_a_few_dozen_bytes() -> None:
    """At the default of 2M ids the index must fit the ingest process's 300 MB with room to spare:
    a tuple-keyed dict takes about 400 B an id (the key's tuple and string, the placement's tuple
    and ints), 0.8 GB at 2M."""
    n = 100_000
    at = now_us()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = DedupIndex(window_s=3600, max_entries=2_000_000)
        for i, key in enumerate(keys(n)):  # made and dropped here: only what the index keeps counts
            index.remember(key, (i % 12, 1_000_000 + i, at + i))
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert len(index) == n
    assert per_entry <= 64, f"{per_entry:.0f} bytes per entry"


def test_ids_over_columns_are_the_ids_of_each_row() -> None:
    rows = [("a", None, None), (None, "p", 7), (None, "p", None), (None, None, None), ("a", "p", 7),
            ("ü:x", None, None), (None, "p:q", 0), ("", None, None)]
    message_id, producer_id, sequence = (pa.chunked_array([list(c)]) for c in zip(*rows, strict=True))
    assert dedup_ids(message_id, producer_id.cast(pa.string()), sequence.cast(pa.int64())).to_pylist() == [
        dedup_id(*row) for row in rows]
    assert dedup_ids(message_id).to_pylist() == [None if m is None else "m:" + m for m, _, _ in rows]


def test_keys_hashed_in_bulk_are_the_keys_remembered_one_by_one() -> None:
    sent = [(TOPIC, "m:a"), ("0" * 32, "m:a"), (TOPIC, "p:x:1"), (TOPIC, "m:ü\ud800")]
    assert [tuple(row) for row in key_hashes(sent).tolist()] == [key_hash(k) for k in sent]
    index = DedupIndex(window_s=3600, max_entries=100)
    at = now_us()
    for i, (h0, h1) in enumerate(key_hashes(sent).tolist()):
        index.restore(h0, h1, (0, i, at))
    assert [index.lookup(k) for k in sent] == [(0, i, at) for i in range(4)]


def test_a_restart_rebuilds_every_kind_of_id_and_skips_those_past_the_window(settings: Settings) -> None:
    singles = [{"value": 1, "producer_id": "p", "sequence": 7}, {"value": 2, "id": "single"}]
    batch = {"messages": [{"value": i, "id": f"b{i}"} for i in range(3)] + [{"value": 9}]}
    with TestClient(create_app(settings)) as c:
        c.post("/v1/topics", json={"name": "o", "partitions": 2})
        first = [c.post("/v1/topics/o/messages?ack=table", json=singles[0]).json(),
                 c.post("/v1/topics/o/messages", json=singles[1]).json()]
        placed = c.post("/v1/topics/o/batch", json=batch).json()["results"]
    with TestClient(create_app(settings)) as c:
        assert [c.post("/v1/topics/o/messages", json=m).json() for m in singles] == [
            {**r, "duplicate": True} for r in first]
        again = c.post("/v1/topics/o/batch", json=batch).json()["results"]
        assert again[:3] == [{**r, "duplicate": True} for r in placed[:3]]
        assert not again[3]["duplicate"], "a message without an id is never a duplicate"
    with TestClient(create_app(settings.model_copy(update={"dedup_window_s": 0}))) as c:
        assert not any(c.post("/v1/topics/o/messages", json=m).json()["duplicate"] for m in singles)
