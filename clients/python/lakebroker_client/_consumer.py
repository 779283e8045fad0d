"""`Consumer`: reads the partitions of one or more topics by offset from the pull API, in order, and commits positions.

Delivery is at least once: a position moves past a message when the consumer hands it out
(poll() returns it, or iteration yields it), and is saved only by commit(). After a crash, a
new consumer resumes from the last commit and sees again what came after it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

import httpx

from lakebroker_client._exceptions import ClientClosed, ClientError
from lakebroker_client._http import Http, refused
from lakebroker_client._models import Message, TopicPartition
from lakebroker_client._offsets import GroupOffsetStore, OffsetStore
from lakebroker_client._retry import Retry
from lakebroker_client._serde import Deserializer

log = logging.getLogger("lakebroker_client")

OffsetReset = Literal["earliest", "latest"]


def high_watermark(ends: dict[str, Any]) -> int:
    """A partition's committed end (offsets below it are in Delta); an older broker names it only
    `committed_offset`."""
    return int(ends["high_watermark"] if "high_watermark" in ends else ends["committed_offset"])


class Consumer:
    """Pulls messages from one or more topics, each partition in offset order.

        Consumer(url, "orders", "payments", group_id="billing", auto_offset_reset="earliest")

    Positions (the next offset to read per topic partition) come from, and commit() saves them to:
    - `group_id="name"`: the broker keeps them, like a Kafka consumer group
      (`/v1/topics/{topic}/groups/{group}/offsets`; shared by every consumer of the group);
    - `offset_store=FileOffsetStore("positions.json")`, or any OffsetStore of yours, e.g. one
      that saves positions in the same transaction as your results;
    - neither: positions live only in this object, and commit() is an error.
    A partition with no saved position starts at `auto_offset_reset`: "earliest" (the oldest
    message retention kept) or "latest" (the end of what is committed to the table now).

    Topics are subscribed (every partition; new ones are picked up when the topics are listed
    again, every `metadata_max_age_s`, as Kafka's metadata.max.age.ms), or
    `partitions=[TopicPartition(...)]` are assigned by hand. A group's partitions are not
    balanced across consumer instances: run one consumer per group, or assign each instance
    its own partitions.
    """

    def __init__(
        self,
        url: str,
        *topics: str,
        group_id: str | None = None,
        token: str | None = None,
        offset_store: OffsetStore | None = None,
        partitions: Iterable[TopicPartition] | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        max_poll_records: int = 500,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
        idle_wait_s: float = 0.5,
        metadata_max_age_s: float = 30.0,
        retry: Retry | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if group_id is not None and offset_store is not None:
            raise ValueError("give group_id or offset_store, not both")
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(f"auto_offset_reset must be 'earliest' or 'latest', not {auto_offset_reset!r}")
        if not 1 <= max_poll_records <= 10_000:
            raise ValueError("max_poll_records must be 1 to 10000")
        fixed = None if partitions is None else sorted({TopicPartition(*tp) for tp in partitions})
        if fixed is not None and topics:
            raise ValueError("subscribe to topics or assign partitions, not both")
        self.group_id = group_id
        self._http = Http(url, token, timeout_s=timeout_s, retry=retry or Retry(), transport=transport)
        self._store: OffsetStore | None = GroupOffsetStore(self._http, group_id) if group_id is not None \
            else offset_store
        self._fixed = fixed
        self._topics: list[str] = sorted({tp.topic for tp in fixed} if fixed is not None else set(topics))
        self._reset = auto_offset_reset
        self._max_poll = max_poll_records
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._idle_wait_s = idle_wait_s
        self._metadata_max_age_s = metadata_max_age_s
        self._positions: dict[TopicPartition, int] = {}  # next offset to hand out
        self._fetch_pos: dict[TopicPartition, int] = {}  # next offset to fetch (ahead by what is buffered)
        self._ends: dict[TopicPartition, int] = {}  # committed end of each partition, as last seen
        self._metadata_at: dict[str, float] = {}  # topic -> when its partitions were last listed
        self._buffer: deque[Message] = deque()
        self._rotation = 0
        self._closed = False

    # -- the public API -----------------------------------------------------------------
    def subscribe(self, topics: Iterable[str]) -> None:
        """Replace the subscription: partitions of topics no longer listed are dropped (uncommitted)."""
        self._check_open()
        if self._fixed is not None:
            raise ValueError("this consumer has assigned partitions; it cannot also subscribe")
        self._topics = sorted(set(topics))
        kept = set(self._topics)
        for tp in [tp for tp in self._positions if tp.topic not in kept]:
            self._forget(tp)
        self._metadata_at = {t: at for t, at in self._metadata_at.items() if t in kept}

    def subscription(self) -> set[str]:
        return set(self._topics)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads."""
        self._ensure_assigned()
        return set(self._positions)

    def poll(self, max_records: int | None = None, timeout_s: float = 0.0) -> list[Message]:
        """Up to `max_records` messages, waiting up to `timeout_s` for the first; [] if none came.

        Messages of one partition come in offset order; partitions take turns.
        """
        self._check_open()
        self._ensure_assigned()
        limit = max_records or self._max_poll
        deadline = time.monotonic() + timeout_s
        while True:
            if not self._buffer:
                self._fill()
            if self._buffer:
                return self._take(limit)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            time.sleep(min(self._idle_wait_s, remaining))

    def __iter__(self) -> Iterator[Message]:
        """Every message, waiting for new ones, until close(). The position moves as each is yielded."""
        while not self._closed:
            try:
                batch = self.poll(1, timeout_s=self._idle_wait_s)
            except ClientClosed:
                if self._closed:  # close() from another thread
                    return
                raise
            yield from batch

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """Save positions (default: past every message handed out so far); returns what was saved.

        Positions are saved topic by topic: with several topics, a failure part-way leaves the
        earlier topics committed (and the call raises).
        """
        self._check_open()
        if self._store is None:
            raise ClientError("this consumer has nowhere to commit: give it a group_id or an offset_store")
        self._ensure_assigned()
        saved = {TopicPartition(*tp): o for tp, o in offsets.items()} if offsets is not None else self.positions()
        by_topic: dict[str, dict[int, int]] = {}
        for tp, offset in saved.items():
            by_topic.setdefault(tp.topic, {})[tp.partition] = offset
        for topic, positions in sorted(by_topic.items()):
            self._store.save(topic, positions)
        return saved

    def positions(self) -> dict[TopicPartition, int]:
        """The next offset to hand out, per assigned partition."""
        self._ensure_assigned()
        return dict(self._positions)

    def lag(self) -> dict[TopicPartition, int]:
        """Messages committed to the table and not yet handed out, per partition, as last seen."""
        return {tp: max(0, self._ends.get(tp, pos) - pos) for tp, pos in self.positions().items()}

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Hand out `partition` from `offset` next (a later commit() saves it)."""
        self._ensure_assigned()
        tp = TopicPartition(*partition)
        if tp not in self._positions:
            raise ValueError(f"{tp} is not assigned to this consumer")
        self._buffer = deque(m for m in self._buffer if (m.topic, m.partition) != tp)
        self._positions[tp] = self._fetch_pos[tp] = offset

    def close(self) -> None:
        """Stop (an iteration ends after its current message). Positions are not committed."""
        self._closed = True
        self._http.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- assignment ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the consumer is closed")

    @staticmethod
    def _topic_path(topic: str) -> str:
        return f"/v1/topics/{quote(topic, safe='')}"

    def _metadata(self, topic: str) -> dict[int, dict[str, Any]]:
        response = self._http.request("GET", self._topic_path(topic))
        if not response.is_success:
            raise refused(response, f"describe topic {topic!r}")
        return {p["partition"]: p for p in response.json()["partition_offsets"]}

    def _ensure_assigned(self) -> None:
        now = time.monotonic()
        for topic in self._topics:
            seen_at = self._metadata_at.get(topic)
            if seen_at is None:
                self._assign_new(topic, self._metadata(topic), new_partitions=False)
            elif self._fixed is None and now - seen_at >= self._metadata_max_age_s:
                self._assign_new(topic, self._metadata(topic), new_partitions=True)
            else:
                continue
            self._metadata_at[topic] = now

    def _assign_new(self, topic: str, info: dict[int, dict[str, Any]], *, new_partitions: bool) -> None:
        if self._fixed is not None:
            wanted = [tp.partition for tp in self._fixed if tp.topic == topic]
            unknown = [p for p in wanted if p not in info]
            if unknown:
                raise ValueError(f"topic {topic!r} has no partition {unknown[0]} ({len(info)} partitions)")
        else:
            wanted = sorted(info)
        wanted = [p for p in wanted if TopicPartition(topic, p) not in self._positions]
        if not wanted:
            return
        saved = self._store.load(topic) if self._store is not None else {}
        for p in wanted:
            if p in saved:
                position = saved[p]
            elif new_partitions or self._reset == "earliest":  # a partition added later starts at its beginning
                position = info[p]["log_start_offset"]
            else:
                position = high_watermark(info[p])
            tp = TopicPartition(topic, p)
            self._positions[tp] = self._fetch_pos[tp] = position
            self._ends[tp] = high_watermark(info[p])

    def _forget(self, tp: TopicPartition) -> None:
        self._buffer = deque(m for m in self._buffer if (m.topic, m.partition) != tp)
        for state in (self._positions, self._fetch_pos, self._ends):
            state.pop(tp, None)

    # -- fetching -----------------------------------------------------------------------
    def _fill(self) -> None:
        """One round over the partitions, starting one further each time, until max_poll_records."""
        parts = sorted(self._fetch_pos)
        if not parts:
            return
        self._rotation = (self._rotation + 1) % len(parts)
        room = self._max_poll
        for tp in parts[self._rotation:] + parts[:self._rotation]:
            if room <= 0:
                break
            room -= self._fetch(tp, room)
        self._catch_up()

    def _fetch(self, tp: TopicPartition, limit: int) -> int:
        offset = self._fetch_pos[tp]
        response = self._http.request("GET", f"{self._topic_path(tp.topic)}/partitions/{tp.partition}/messages",
                                      params={"offset": offset, "limit": limit})
        if response.status_code == 416:
            self._out_of_range(tp, offset)
            return 0
        if not response.is_success:
            raise refused(response, f"read topic {tp.topic!r} partition {tp.partition}")
        body = response.json()
        for m in body["messages"]:
            self._buffer.append(self._deserialized(Message.from_json(m, tp.topic)))
        self._fetch_pos[tp] = body["next_offset"]
        self._ends[tp] = high_watermark(body)
        return len(body["messages"])

    def _deserialized(self, message: Message) -> Message:
        changes: dict[str, Any] = {}
        if self._key_deserializer is not None and message.key is not None:
            changes["key"] = self._key_deserializer(message.key.encode())
        if self._value_deserializer is not None and message.data is not None:
            changes["value"] = self._value_deserializer(message.data)
        return dataclasses.replace(message, **changes) if changes else message

    def _out_of_range(self, tp: TopicPartition, offset: int) -> None:
        info = self._metadata(tp.topic)[tp.partition]
        start, committed, end = info["log_start_offset"], high_watermark(info), info["log_end_offset"]
        if offset < start:
            log.warning("topic %s partition %d: offsets %d-%d were removed by retention before this consumer "
                        "read them; continuing at %d", tp.topic, tp.partition, offset, start - 1, start)
            target = start
        elif offset <= end:
            return  # accepted by the broker but not in the table yet: read it next round
        else:
            target = start if self._reset == "earliest" else committed
            log.warning("topic %s partition %d: position %d is past the log end %d (a restored or failed-over "
                        "broker?); resetting to %s offset %d", tp.topic, tp.partition, offset, end, self._reset,
                        target)
        self._fetch_pos[tp] = self._positions[tp] = target
        self._ends[tp] = committed

    def _take(self, limit: int) -> list[Message]:
        out = [self._buffer.popleft() for _ in range(min(limit, len(self._buffer)))]
        for m in out:
            self._positions[TopicPartition(m.topic, m.partition)] = m.offset + 1
        self._catch_up()
        return out

    def _catch_up(self) -> None:
        """A partition with nothing buffered is positioned at its fetch position (past compaction holes)."""
        buffered = {(m.topic, m.partition) for m in self._buffer}
        for tp, pos in self._fetch_pos.items():
            if tp not in buffered:
                self._positions[tp] = pos
