"""The ownership table (tables/ownership.py): balanced plans, takes, graceful releases and
expired leases, with real state tables shared by several node objects."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lakebroker.tables.layout import Layout
from lakebroker.tables.ownership import OwnershipTable, Pair, balance


def _pairs(topics: dict[str, int]) -> dict[Pair, str]:
    return {(f"id-{t}", p): t for t, n in topics.items() for p in range(n)}


def test_balance_is_fair_sticky_and_the_same_everywhere() -> None:
    pairs = sorted(_pairs({"a": 6, "b": 4}))
    plan = balance(pairs, ["n2", "n1", "n3"], {})
    assert sorted(Counter(plan.values()).values()) == [3, 3, 4]
    assert plan == balance(pairs, ["n3", "n1", "n2"], {}), "node order must not matter"
    assert {plan[("id-a", p)] for p in range(3)} == {"n1", "n2", "n3"}, "a topic spreads over the nodes"
    # A fourth node joins: it gets a fair share, and only the pairs it takes move.
    joined = balance(pairs, ["n1", "n2", "n3", "n4"], plan)
    assert sorted(Counter(joined.values()).values()) == [2, 2, 3, 3]
    assert sum(1 for pair in pairs if joined[pair] != plan[pair]) == 2
    # n2 dies: only its pairs move.
    survivors = balance(pairs, ["n1", "n3"], {p: o for p, o in plan.items() if o != "n2"})
    assert all(survivors[p] == o for p, o in plan.items() if o != "n2")
    assert sorted(Counter(survivors.values()).values()) == [5, 5]
    assert balance(pairs, [], {}) == {}


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path / "data")


def test_nodes_share_the_partitions_and_a_move_is_a_release_then_a_take(layout: Layout) -> None:
    pairs = _pairs({"orders": 4})
    a = OwnershipTable(layout, "a", "http://127.0.0.1:1", ttl_s=30)
    b = OwnershipTable(layout, "b", "http://127.0.0.1:2", ttl_s=30)
    first = a.heartbeat(pairs)
    assert first.held == {pair: 1 for pair in pairs} and first.taken == set(pairs)
    assert first.give_up == set()

    joined = b.heartbeat(pairs)  # the plan gives b half, but a still holds them
    assert joined.held == {} and joined.taken == set()
    moving = a.heartbeat(pairs)
    assert len(moving.give_up) == 2 and set(moving.held) == set(pairs), "a keeps them until it has drained"
    assert a.heartbeat(pairs, release=moving.give_up).held.keys() == set(pairs) - moving.give_up
    taken = b.heartbeat(pairs)
    assert taken.taken == moving.give_up and set(taken.held.values()) == {2}, "a new owner, a new epoch"

    view = a.view()
    assert {n.node: n.url for n in view.live_nodes().values()} == {"a": "http://127.0.0.1:1", "b": "http://127.0.0.1:2"}
    for pair in pairs:
        owner = view.owner_of(pair)
        assert owner is not None and owner.node == ("b" if pair in moving.give_up else "a")
    assert a.heartbeat(pairs).give_up == set() and b.heartbeat(pairs).give_up == set(), "balanced: nothing moves"


def test_a_dead_nodes_leases_expire_and_the_survivor_takes_them_with_a_new_epoch(layout: Layout) -> None:
    pairs = _pairs({"orders": 2})
    dead = OwnershipTable(layout, "dead", "http://127.0.0.1:1", ttl_s=0.5)
    live = OwnershipTable(layout, "live", "http://127.0.0.1:2", ttl_s=0.5)
    assert dead.heartbeat(pairs).held == {pair: 1 for pair in pairs}
    assert live.heartbeat(pairs).held == {}, "the leases are live: nothing is taken from a live node"
    time.sleep(0.6)
    after = live.heartbeat(pairs)
    assert after.held == {pair: 2 for pair in pairs} and after.taken == set(pairs)
    view = live.view()
    assert set(view.live_nodes()) == {"live"}
    assert all(view.owner_of(pair) is not None for pair in pairs)


def test_a_view_says_when_the_first_lease_of_another_node_runs_out(layout: Layout) -> None:
    a = OwnershipTable(layout, "a", "http://127.0.0.1:1", ttl_s=30)
    b = OwnershipTable(layout, "b", "http://127.0.0.1:2", ttl_s=60)
    pairs = _pairs({"orders": 4})
    a.heartbeat(pairs)
    assert a.view().next_expiry("a") is None, "its own leases are not another node's"
    b.heartbeat(pairs)
    moving = a.heartbeat(pairs)
    a.heartbeat(pairs, release=moving.give_up)
    b.heartbeat(pairs)  # b takes its half, on its 60 s lease
    view = a.view()
    b_row = next(n for n in view.nodes if n.node == "b")
    assert view.next_expiry("a") == b_row.expires_at
    assert view.next_expiry("b") == next(n for n in view.nodes if n.node == "a").expires_at
    assert b.heartbeat(pairs, leave=True).held == {}
    assert a.view().next_expiry("a") is None, "released leases run out no more"


def test_leaving_releases_everything_and_deleted_topics_are_forgotten(layout: Layout) -> None:
    pairs = _pairs({"orders": 2, "audit": 1})
    a = OwnershipTable(layout, "a", "http://127.0.0.1:1", ttl_s=30)
    b = OwnershipTable(layout, "b", "http://127.0.0.1:2", ttl_s=30)
    a.heartbeat(pairs)
    left = a.heartbeat(pairs, leave=True)
    assert left.held == {} and not left.view.live_nodes()
    assert b.heartbeat(pairs).held == {pair: 2 for pair in pairs}, "released leases are taken at once"
    assert a.heartbeat(pairs).held == {}, "a is back, and the plan leaves them with b for now"
    b.heartbeat(pairs, leave=True)
    assert a.heartbeat(pairs).held == {pair: 3 for pair in pairs}, "another node held them last: a new epoch"
    assert a.heartbeat(pairs, leave=True).held == {}
    assert a.heartbeat(pairs).held == {pair: 3 for pair in pairs}, "a held them last: the same epoch"
    b.forget_topic("id-orders")
    assert set(b.view().owners) == {("id-audit", 0)}


def test_a_node_whose_clock_runs_ahead_lets_go_at_once_when_it_leaves_or_releases(layout: Layout) -> None:
    """A release is explicit, whatever the releasing node's clock: one a minute ahead wrote its own
    "now" as the expiry, which the others saw as a live lease for another minute."""
    pairs = _pairs({"orders": 2})
    ahead = OwnershipTable(layout, "ahead", "http://127.0.0.1:1", ttl_s=30,
                           clock=lambda: datetime.now(UTC) + timedelta(seconds=60))
    other = OwnershipTable(layout, "other", "http://127.0.0.1:2", ttl_s=30)
    held = ahead.heartbeat(pairs).held
    assert held.keys() == pairs.keys()
    one = next(iter(pairs))
    ahead.heartbeat(pairs, release=frozenset({one}))
    assert other.heartbeat(pairs).held == {one: 2}, "a released lease is free on every clock"
    ahead.heartbeat(pairs, leave=True)
    assert other.heartbeat(pairs).held.keys() == pairs.keys(), "so is a leaving node's every lease"
    assert set(other.view().live_nodes()) == {"other"}


def test_a_draining_node_is_planned_nothing_takes_nothing_and_keeps_what_it_holds(layout: Layout) -> None:
    """A stopping node drains: the others' plans share every partition among themselves, it takes
    none back, and the leases it holds stay its own until it releases them."""
    pairs = _pairs({"orders": 4})
    a = OwnershipTable(layout, "a", "http://127.0.0.1:1", ttl_s=30)
    b = OwnershipTable(layout, "b", "http://127.0.0.1:2", ttl_s=30)
    assert a.heartbeat(pairs).taken == set(pairs)
    b.heartbeat(pairs)
    released = a.heartbeat(pairs, release=a.heartbeat(pairs).give_up)  # half of them move to b
    assert b.heartbeat(pairs).taken == set(pairs) - set(released.held)
    kept = set(released.held)

    draining = a.heartbeat(pairs, draining=True)
    assert set(draining.held) == kept and draining.taken == set(), "it keeps what it holds, takes nothing"
    assert draining.give_up == kept, "every plan gives its pairs to the nodes that stay"
    assert b.heartbeat(pairs).taken == set(), "b waits for a to release them"
    assert [n.draining for n in b.view().nodes] == [True, False]
    assert a.heartbeat(pairs, release=kept, draining=True).held == {}
    assert b.heartbeat(pairs).taken == kept and a.heartbeat(pairs, draining=True).taken == set()
    assert set(b.heartbeat(pairs).held) == set(pairs)


def test_a_node_back_after_its_leases_ran_out_is_given_older_pairs_not_those_just_taken_from_it(
        layout: Layout) -> None:
    """A node paused past its TTL (or killed and restarted) comes back while the others are still
    claiming and opening the pairs they took from it. The plan gives it back its share, and what the
    others give up must be pairs they have held for a while: handing over a pair just taken closes it
    again before it ever opened, and its outage runs on through a second claim (the cluster soak:
    two partitions 14 s unavailable after a 10 s pause, bound 13 s)."""
    pairs = _pairs({"orders": 12})
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    nodes = {name: OwnershipTable(layout, name, f"http://127.0.0.1:{i}", ttl_s=8, clock=lambda: now[0])
             for i, name in enumerate(("a", "b", "c"), start=1)}

    give_up: dict[str, frozenset[Pair]] = {}
    for _ in range(3):  # a takes all, b and c join, a hands them their shares
        for name, table in nodes.items():
            give_up[name] = table.heartbeat(pairs, release=give_up.get(name, frozenset())).give_up
    held = {name: set(table.heartbeat(pairs).held) for name, table in nodes.items()}
    assert sorted(len(h) for h in held.values()) == [4, 4, 4]
    now[0] += timedelta(seconds=5)  # c stopped; a and b renew
    assert all(not nodes[name].heartbeat(pairs).taken for name in ("a", "b"))
    now[0] += timedelta(seconds=4)  # c's leases ran out
    took = {name: nodes[name].heartbeat(pairs).taken for name in ("a", "b")}
    assert took["a"] | took["b"] == held["c"]
    now[0] += timedelta(seconds=1)  # c is back, before a and b have opened what they took
    assert nodes["c"].heartbeat(pairs).taken == set()
    for name in ("a", "b"):
        beat = nodes[name].heartbeat(pairs)
        assert len(beat.give_up) == len(took[name]), "a and b give c back its share"
        assert not beat.give_up & took[name], f"{name} hands over pairs it has not opened yet"
