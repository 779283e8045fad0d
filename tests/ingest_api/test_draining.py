"""A node that stops drains first (Membership.drain): it takes no partition back while it hands its
parked messages on, and the nodes that stay get what it lets go (the cluster soak saw a stopping
node claim partitions again and depose the node taking them over, until its messages were left in
its WAL)."""

from __future__ import annotations

from pathlib import Path

from lakebroker.tables.topics import new_topic
from tests.ingest_api.test_topic_following import _node, _until


async def test_a_draining_node_takes_nothing_back_and_the_others_get_what_it_lets_go(tmp_path: Path) -> None:
    a, b = _node(tmp_path, "a", 18311), _node(tmp_path, "b", 18312)
    await a.start()
    await b.start()
    try:
        topic = await a.create_topic(new_topic("t", 4))
        await _until(lambda: len(a.ownership.owned_pairs()) == 2 and len(b.ownership.owned_pairs()) == 2,
                     "two partitions each", 20)
        kept = sorted(a.ownership.owned_pairs())
        a.cluster.drain()
        await a.cluster.beat()
        assert sorted(a.ownership.owned_pairs()) == kept, "a keeps what it holds while it drains"
        assert [n.draining for n in b.cluster.table.view().nodes if n.node == a.cluster.node] == [True]

        # One of a's partitions becomes free (its hand-over done): b takes it, a does not take it back,
        # though it was a's share of the plan before a drained.
        freed = kept[0]
        a.ownership.disown({freed})
        a.cluster._released.add(freed)
        await a.cluster.beat()
        await _until(lambda: freed in b.ownership.owned_pairs(), "b takes the partition a let go", 20)
        for _ in range(5):
            await a.cluster.beat()
        assert freed not in a.ownership.owned_pairs()
        assert (bytes.fromhex(topic.topic_id), freed[1]) not in a.ownership.epochs
        assert sorted(a.ownership.owned_pairs()) == kept[1:]
    finally:
        await a.stop()
        await b.stop()
