"""The committed ends of the partitions this node does not own, as their topic tables hold them.

Only a partition's owner knows its ends from its own commits. Every other node reads them from
the table, which is where readers find the messages anyway, so any node answers reads, topic
descriptions, group positions and subscription status for every partition behind a load
balancer. tables/log_tail.py follows a table's log commit by commit: a look when nothing changed
costs one failed open of the next commit file.
"""

from __future__ import annotations

import asyncio

from deltalake.exceptions import DeltaError

from lakebroker.ingest_api.reader import unreadable
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.topics import TopicConfig


class TableEnds:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._tails: dict[str, TopicLogTail] = {}  # topic id -> its table's tail
        self._ends: dict[str, dict[int, int]] = {}  # topic id -> partition -> committed end, at the last look
        self._looking: dict[str, asyncio.Lock] = {}  # a tail is not thread-safe: one look at a time

    async def follow(self, topic: TopicConfig) -> None:
        """Bring the topic's ends up to its table's newest commit."""
        tail = self._tails.get(topic.topic_id)
        if tail is None:
            tail = self._tails[topic.topic_id] = TopicLogTail(self.layout.topic_table(topic))
            self._looking[topic.topic_id] = asyncio.Lock()
        async with self._looking[topic.topic_id]:
            try:
                ends = await asyncio.to_thread(_look, tail, topic.partitions)
            except DeltaError as exc:
                raise unreadable(self.layout, topic, exc) from None
        if topic.topic_id in self._tails:  # not forgotten meanwhile (the topic deleted)
            self._ends[topic.topic_id] = ends

    def committed_end(self, topic: TopicConfig, partition: int) -> int:
        """The partition's committed end at the last `follow` (0 before one)."""
        return self._ends.get(topic.topic_id, {}).get(partition, 0)

    def forget(self, topic_id: str) -> None:
        for held in (self._tails, self._ends, self._looking):
            held.pop(topic_id, None)


def _look(tail: TopicLogTail, partitions: int) -> dict[int, int]:
    if tail.refresh() < 0:
        return {}
    return {p: tail.committed_end(p) for p in range(partitions)}
