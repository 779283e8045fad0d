"""The dispatch queue's ordering rule, driven directly (no I/O): delivery_worker/ordering.py."""

from __future__ import annotations

import random
from typing import Any

from lakebroker.delivery_worker.ordering import DispatchQueue, Unit
from lakebroker.tables.subscriptions import Ordering


def rows(keys: list[str | None]) -> list[dict[str, Any]]:
    return [{"offset": i, "key": k} for i, k in enumerate(keys)]


def offsets(unit: Unit | None) -> list[int] | None:
    return None if unit is None else [r["offset"] for r in unit.rows]


def test_key_ordering_holds_back_only_the_busy_key() -> None:
    queue = DispatchQueue(Ordering.KEY, batch_size=1)
    queue.extend(rows(["a", "b", "a", "c", "a", None, None]))
    a0, b1, c3 = queue.take(), queue.take(), queue.take()
    assert [offsets(a0), offsets(b1), offsets(c3)] == [[0], [1], [3]]  # a's 2 and 4 wait behind 0
    keyless = queue.take()
    assert offsets(keyless) == [5] and queue.take() is None  # keyless: in order among themselves
    assert keyless is not None and len(queue) == 3
    queue.release(keyless)
    assert offsets(queue.take()) == [6] and queue.take() is None
    assert a0 is not None
    queue.release(a0)
    a2 = queue.take()
    assert offsets(a2) == [2] and queue.take() is None
    assert a2 is not None
    queue.release(a2)
    assert offsets(queue.take()) == [4] and len(queue) == 0


def test_partition_ordering_sends_one_unit_at_a_time() -> None:
    queue = DispatchQueue(Ordering.PARTITION, batch_size=2)
    queue.extend(rows(["a", "b", "c"]))
    first = queue.take()
    assert offsets(first) == [0, 1] and queue.take() is None
    assert first is not None
    queue.release(first)
    assert offsets(queue.take()) == [2]


def test_none_ordering_has_no_rule() -> None:
    queue = DispatchQueue(Ordering.NONE, batch_size=1)
    queue.extend(rows(["a", "a", "a"]))
    assert [offsets(queue.take()) for _ in range(3)] == [[0], [1], [2]]


def test_random_schedules_keep_each_key_in_order_with_one_unit_in_flight() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        ordering = rng.choice([Ordering.KEY, Ordering.PARTITION, Ordering.NONE])
        queue = DispatchQueue(ordering, batch_size=rng.choice([1, 1, 3]))
        keys = [rng.choice(["a", "b", "c", "d", None]) for _ in range(300)]
        fed, sent, in_flight = 0, [], []
        while len(sent) < len(keys):
            if fed < len(keys) and rng.random() < 0.3:
                n = rng.randint(1, 20)
                queue.extend(rows(keys)[fed:fed + n])
                fed += len(rows(keys)[fed:fed + n])
            unit = queue.take() if rng.random() < 0.6 else None
            if unit is not None:
                busy = {queue.key(r) for u in in_flight for r in u.rows}
                assert not busy & unit.keys, f"seed {seed}: a key in flight twice"
                if ordering is Ordering.PARTITION:
                    assert not in_flight
                in_flight.append(unit)
                sent.extend(unit.rows)
            elif in_flight:
                queue.release(in_flight.pop(rng.randrange(len(in_flight))))
        assert sorted(r["offset"] for r in sent) == list(range(len(keys)))  # each exactly once
        by_key: dict[Any, list[int]] = {}
        for r in sent:
            by_key.setdefault(r["key"], []).append(r["offset"])  # keyless messages: one key
        if ordering is not Ordering.NONE:
            assert all(o == sorted(o) for o in by_key.values()), f"seed {seed}: a key out of order"


def test_key_is_the_default_ordering_in_the_api_and_the_table() -> None:
    from lakebroker.ingest_api.routes.subscriptions import SubscriptionCreate
    from lakebroker.tables.subscriptions import Subscription, new_secret

    assert SubscriptionCreate(name="s", topic="t", url="https://example.com/").ordering is Ordering.KEY
    assert Subscription(name="s", topic="t", url="https://example.com/", secrets=(new_secret(),)).ordering \
        is Ordering.KEY
