"""The dedup index: its answers, its eviction, its memory per entry, and its rebuild at start."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from lakebroker.ingest_api import dedup_rebuild
from lakebroker.ingest_api.dedup import DedupIndex, DedupKey, Placed, dedup_id, dedup_ids, key_hash, key_hashes
from lakebroker.server import build_app
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.settings import Settings
from tests.spark_pipeline.topics import create_topic, settings_for

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


async def test_ids_being_stored_again_wait_for_their_new_placement_and_a_failed_move_forgets_them() -> None:
    """`move`: ids placed before (a, b), one never placed (c), and a row without an id, stored again
    from offset 40: until that is durable, a lookup waits for the id's own new offset; once it is, the
    index answers it. A move that fails leaves the ids unknown, and a send accepted afresh then
    updates the entry in place."""
    index = DedupIndex(window_s=3600, max_entries=100)
    a, b, c, d = ((TOPIC, f"m:{x}") for x in "abcd")
    index.remember(a, (0, 3, now_us()))
    index.remember(b, (0, 4, now_us()))
    index.remember(d, (0, 5, now_us()))
    first: asyncio.Future[Placed] = asyncio.get_running_loop().create_future()
    index.move([key_hash(a), None, key_hash(b), key_hash(c)], 0, first)
    waits = [index.lookup(k) for k in (a, b, c)]
    assert all(isinstance(w, asyncio.Future) for w in waits), waits
    assert index.lookup(d) == (0, 5, index.lookup(d)[2]), "an id not moved keeps its placement"  # type: ignore[index]
    at = now_us()
    first.set_result((0, 40, at))
    index.remember(a, (0, 40, at))  # as the move's own callbacks do once durable
    index.remember(b, (0, 42, at))
    index.remember(c, (0, 43, at))
    assert [(await w)[1] for w in waits] == [40, 42, 43]  # type: ignore[misc]
    assert index.lookup(b) == (0, 42, at)

    failing: asyncio.Future[Placed] = asyncio.get_running_loop().create_future()
    index.move([key_hash(d)], 0, failing)
    waiting = index.lookup(d)
    assert isinstance(waiting, asyncio.Future)
    failing.set_exception(OSError("disk full"))
    with pytest.raises(OSError):
        await waiting
    await asyncio.sleep(0)  # the move's own callback runs
    assert index.lookup(d) is None, "a move that failed: a retry is accepted afresh"
    afresh: asyncio.Future[Placed] = asyncio.get_running_loop().create_future()
    index.begin(d, afresh)
    index.remember(d, (0, 50, now_us()))
    assert index.lookup(d)[:2] == (0, 50)  # type: ignore[index]
    assert len(index) == 4, "the entry updated in place, not a second one"


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


def test_a_ring_that_wraps_across_its_file_blocks_answers_every_live_id() -> None:
    """2,500 ids over blocks of 1,024 (the last one partial), a tail moved on by expiry, ids
    remembered again in the head's block, the tail's and one only the file holds."""
    index = DedupIndex(window_s=60, max_entries=2_500)
    for i, k in enumerate(keys(300, 1_000_000)):  # each expired as it comes: the ring's tail moves on
        index.remember(k, (0, i, now_us() - 120_000_000))
    assert len(index) == 0
    at = now_us()
    for i, k in enumerate(keys(2_500)):  # ring positions 300..2499, then 0..299
        index.remember(k, (0, i, at))
    assert len(index) == 2_500
    assert all(index.lookup(k) == (0, i, at) for i, k in enumerate(keys(2_500)))
    for i in (0, 1_100, 2_450):  # the tail's block, a block only in the file, the head's block
        index.remember(next(keys(1, i)), (5, 50_000 + i, at))
    expected = {i: (5, 50_000 + i, at) if i in (0, 1_100, 2_450) else (0, i, at) for i in range(2_500)}
    assert all(index.lookup(k) == expected[i] for i, k in enumerate(keys(2_500)))
    for i, k in enumerate(keys(3_000, 2_500)):  # two more trips round the ring
        index.remember(k, (1, i, at))
    assert all(index.lookup(k) is None for k in keys(3_000))
    assert all(index.lookup(k) == (1, i, at) for i, k in enumerate(keys(3_000, 2_500)) if i >= 500)
    index.close()


def _homed_last(index_size: int, n: int) -> list[DedupKey]:
    """Keys whose home is the slot table's last slot."""
    return [k for k in (("f" * 32, f"m:w{i}") for i in range(400_000))
            if (key_hash(k)[0] & 0xFFFF_FFFF) * index_size >> 32 == index_size - 1][:n]


def test_ids_whose_probe_runs_wrap_past_the_slot_tables_end_survive_eviction() -> None:
    """Five ids homed in the last slot: their run wraps to the table's start, and they are
    evicted first."""
    at = now_us()
    index = DedupIndex(window_s=3600, max_entries=2_048)
    wrapping = _homed_last(index._size, 5)
    assert len(wrapping) == 5
    for i, k in enumerate(wrapping):
        index.remember(k, (1, i, at))
    for i, k in enumerate(keys(1_100)):
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


_MEASURE = """
import sys, time
from pathlib import Path
from lakebroker.ingest_api.dedup import DedupIndex

def rss_kb():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS:"))
    return int(line.split()[1])

n = int(sys.argv[1])
at = int(time.time() * 1_000_000)
keys = [("5f1d0c2a9b8e4f7c8a6b3d2e1f0a9b8c", f"m:order-{i:012d}") for i in range(n)]
before = rss_kb()
index = DedupIndex(window_s=3600, max_entries=n)
for i, key in enumerate(keys):
    index.remember(key, (i % 12, 1_000_000 + i, at + i))
assert len(index) == n
print((rss_kb() - before) * 1024 / n)
"""


def test_an_id_takes_about_ten_bytes_of_the_process() -> None:
    """At the default of 2M ids the index must fit the ingest process's 300 MB beside everything
    else: a tuple-keyed dict takes about 400 B an id, arrays of hashes and placements 44. Measured
    as the resident memory of a process of its own (the keys are made before), full."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, "300000"], capture_output=True, text=True, check=True,
                         timeout=120)
    per_id = float(out.stdout)
    assert per_id <= 14, f"{per_id:.1f} bytes per id"


def test_ids_over_columns_are_the_ids_of_each_row() -> None:
    rows = [("a", None, None), (None, "p", 7), (None, "p", None), (None, None, None), ("a", "p", 7),
            ("ü:x", None, None), (None, "p:q", 0), ("", None, None)]
    message_id, producer_id, sequence = (pa.chunked_array([list(c)]) for c in zip(*rows, strict=True))
    partition = pa.chunked_array([[i % 3 for i in range(len(rows))]], pa.int32())
    assert dedup_ids(message_id, producer_id.cast(pa.string()), sequence.cast(pa.int64()), partition).to_pylist() \
        == [dedup_id(*row, i % 3) for i, row in enumerate(rows)]
    assert dedup_ids(message_id, producer_id.cast(pa.string()), sequence.cast(pa.int64()), 2).to_pylist() == [
        dedup_id(*row, 2) for row in rows]
    assert dedup_ids(message_id).to_pylist() == [None if m is None else "m:" + m for m, _, _ in rows]
    # A producer's sequence 7 in two partitions is two messages; a message id is one wherever it goes.
    assert dedup_id(None, "p", 7, 0) != dedup_id(None, "p", 7, 1)
    assert dedup_id("a", "p", 7, 0) == dedup_id("a", "p", 7, 1)


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
    with TestClient(build_app(settings)) as c:
        c.post("/v1/topics", json={"name": "o", "partitions": 2})
        first = [c.post("/v1/topics/o/messages?ack=table", json=singles[0]).json(),
                 c.post("/v1/topics/o/messages", json=singles[1]).json()]
        placed = c.post("/v1/topics/o/batch", json=batch).json()["results"]
    with TestClient(build_app(settings)) as c:
        assert [c.post("/v1/topics/o/messages", json=m).json() for m in singles] == [
            {**r, "duplicate": True} for r in first]
        again = c.post("/v1/topics/o/batch", json=batch).json()["results"]
        assert again[:3] == [{**r, "duplicate": True} for r in placed[:3]]
        assert not again[3]["duplicate"], "a message without an id is never a duplicate"
    with TestClient(build_app(settings.model_copy(update={"dedup_window_s": 0}))) as c:
        assert not any(c.post("/v1/topics/o/messages", json=m).json()["duplicate"] for m in singles)


def test_a_restart_over_max_entries_keeps_exactly_the_newest_ids_in_age_order(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids in two topics' tables, more than max_entries, read back in time ranges of a few ids
    each: the rebuilt index holds exactly the newest max_entries, and forgets them oldest first."""
    monkeypatch.setattr(dedup_rebuild, "RANGE_IDS", 7)
    small = settings.model_copy(update={"dedup_max_entries": 40})
    sent: list[DedupKey] = []  # (topic name, id), in the order sent: the order of their log-append times
    with TestClient(build_app(small)) as c:
        for name in ("a", "b"):
            c.post("/v1/topics", json={"name": name, "partitions": 3})
        for i in range(30):
            name = "ab"[i % 2]
            if i % 3:
                assert c.post(f"/v1/topics/{name}/messages", json={"value": i, "id": f"s{i}"}).status_code == 200
                sent.append((name, f"s{i}"))
            else:  # a batch of three, with one log-append time
                batch = [{"value": i, "id": f"b{i}-{j}"} for j in range(3)]
                assert c.post(f"/v1/topics/{name}/batch", json={"messages": batch}).status_code == 200
                sent += [(name, m["id"]) for m in batch]
        topic_ids = {name: c.app.state.broker.topic(name).topic_id for name in "ab"}  # type: ignore[attr-defined]
    assert len(sent) == 50 and sent[10] == ("a", "b6-0")  # the 40 newest begin with a batch
    with TestClient(build_app(small)) as c:
        index = c.app.state.broker.dedup  # type: ignore[attr-defined]
        placed = {(n, i): index.lookup((topic_ids[n], "m:" + i)) for n, i in sent}
        assert {k for k, v in placed.items() if v is not None} == set(sent[10:])
        assert len(index) == 40
        # forgotten oldest first: each new id pushes out one of the oldest left (a batch's ids tie)
        left = {k: v[2] for k, v in placed.items() if v is not None}
        at = now_us()
        for n in range(39):
            index.remember((TOPIC, f"m:new-{n}"), (0, n, at))
            gone = [k for k in left if index.lookup((topic_ids[k[0]], "m:" + k[1])) is None]
            assert len(gone) == 1 and left[gone[0]] == min(left.values()), f"after {n + 1} new ids: {gone}"
            del left[gone[0]]


def test_a_rebuild_range_starting_within_a_files_last_logged_millisecond_still_reads_its_ids(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges start at ids' own times, and the flusher logs a file's timestamp bounds truncated to
    the millisecond: a range starting at .0095, the last id of a file logged as ending at .009,
    must still read that file (delta-rs's reader widens the bound), or the id is forgotten over a
    restart."""
    monkeypatch.setattr(dedup_rebuild, "RANGE_IDS", 1)  # a range per id
    settings = settings_for(tmp_path)
    topic = create_topic(settings, "t", partitions=1)
    base = (int(time.time()) - 60) * 1_000_000  # a whole second, within the window
    rows = {"partition": [0, 0], "offset": [0, 1], "timestamp": [base, base + 9_500], "key": [None, None],
            "value": [b"a", b"b"], "format": ["text", "text"], "headers": [None, None],
            "message_id": ["first", "second"], "producer_id": [None, None], "sequence": [None, None]}
    table = delta.load(Layout.of(settings).topic_table(topic))
    delta.append_partitions(table, {0: pa.table(rows, schema=TOPIC_SCHEMA)},
                            txns={delta.partition_app_id(0): 2})
    index = DedupIndex(window_s=3600, max_entries=100)
    assert dedup_rebuild.rebuild(index, Layout.of(settings), [topic], [], [], {}, window_s=3600) == 2
    assert index.lookup((topic.topic_id, "m:second")) == (0, 1, base + 9_500)
