"""The heartbeat keeps `_system/partition_owners` to the topics the topic store has: a node whose
view of the topics is stale neither takes nor writes back partitions of a deleted topic, and rows
of one (a stale node's, a pin) leave at the next heartbeat of any node."""

from __future__ import annotations

from pathlib import Path

from lakebroker.tables.layout import Layout
from lakebroker.tables.ownership import OwnershipTable, Pair


def _pairs(topics: dict[str, int]) -> dict[Pair, str]:
    return {(f"id-{t}", p): t for t, n in topics.items() for p in range(n)}


def test_a_stale_heartbeat_takes_no_partition_of_a_deleted_topic_and_its_rows_leave(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    store = {"id-orders", "id-audit"}  # the topic ids the topic store holds
    a = OwnershipTable(layout, "a", "http://127.0.0.1:1", ttl_s=30, live_topics=lambda: set(store))
    b = OwnershipTable(layout, "b", "http://127.0.0.1:2", ttl_s=30, live_topics=lambda: set(store))
    stale = _pairs({"orders": 2, "audit": 1})  # b's view: it has not seen `audit` deleted
    a.heartbeat(stale)
    a.pin(("id-audit", 0), "audit", "a")
    store.discard("id-audit")
    a.forget_topic("id-audit")  # the delete, through a

    beat = b.heartbeat(stale)
    assert not [pair for pair in beat.held if pair[0] == "id-audit"]
    assert set(b.view().owners) == {("id-orders", 0), ("id-orders", 1)}

    # Rows written while the topic was still in the store, by a node that then missed the delete:
    # the next heartbeat of any node removes them, pins too.
    store.add("id-audit")
    b.heartbeat(stale, leave=True)
    a.heartbeat(stale)
    a.pin(("id-audit", 0), "audit", "b")
    assert ("id-audit", 0) in a.view().owners
    store.discard("id-audit")
    b.heartbeat(_pairs({"orders": 2}))
    view = a.view()
    assert set(view.owners) == {("id-orders", 0), ("id-orders", 1)} and not view.pins


def test_a_delete_that_lands_while_a_heartbeat_is_planned_is_not_undone(tmp_path: Path) -> None:
    """The store is read in every attempt of the commit: a heartbeat planned before a delete, whose
    commit loses to the delete's `forget_topic`, plans again without the topic."""
    layout = Layout(tmp_path)
    store = {"id-orders"}
    a = OwnershipTable(layout, "a", "http://127.0.0.1:1", ttl_s=30, live_topics=lambda: set(store))
    a.heartbeat(_pairs({"orders": 2}))
    a.heartbeat(_pairs({"orders": 2}), leave=True)  # its rows stay, free for b to take
    reads = 0

    def read_then_deleted() -> set[str]:
        nonlocal reads
        reads += 1
        seen = set(store)
        if reads == 1:  # the delete lands right after this read: the store row, then the owners' rows
            store.clear()
            a.forget_topic("id-orders")
        return seen

    b = OwnershipTable(layout, "b", "http://127.0.0.1:2", ttl_s=30, live_topics=read_then_deleted)
    beat = b.heartbeat(_pairs({"orders": 2}))
    assert reads >= 2 and beat.held == {}
    assert a.view().owners == {}
