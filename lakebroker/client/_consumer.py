"""`Consumer`: reads a topic's partitions by offset from the pull API, in order, and commits positions.

Delivery is at least once: a position moves past a message when the consumer hands it out
(poll() returns it, or iteration yields it), and is saved only by commit(). After a crash, a
new consumer resumes from the last commit and sees again what came after it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

import httpx

from lakebroker.client._exceptions import ClientClosed, ClientError
from lakebroker.client._http import Http, refused
from lakebroker.client._models import Message
from lakebroker.client._offsets import GroupOffsetStore, OffsetStore
from lakebroker.client._retry import Retry

log = logging.getLogger("lakebroker.client")

METADATA_MAX_AGE_S = 30.0  # how often a consumer of every partition looks for new ones


class Consumer:
    """Pulls messages from one topic, partition by partition in offset order.

    Positions (the next offset to read per partition) come from, and commit() saves them to:
    - `group="name"`: the broker keeps them, like a Kafka consumer group
      (`/v1/topics/{topic}/groups/{group}/offsets`; shared by every consumer of the group);
    - `offset_store=FileOffsetStore("positions.json")`, or any OffsetStore of yours, e.g. one
      that saves positions in the same transaction as your results;
    - neither: positions live only in this object, and commit() is an error.
    A partition with no saved position starts at `start`: "earliest" (the oldest message
    retention kept) or "latest" (the end of what is committed to the table now).

    A group's partitions are not balanced across consumer instances: run one consumer per
    group, or give each instance its own `partitions`.
    """

    def __init__(
        self,
        url: str,
        topic: str,
        *,
        group: str | None = None,
        token: str | None = None,
        offset_store: OffsetStore | None = None,
        partitions: Sequence[int] | None = None,
        start: Literal["earliest", "latest"] = "earliest",
        max_poll_messages: int = 500,
        idle_wait_s: float = 0.5,
        retry: Retry | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if group is not None and offset_store is not None:
            raise ValueError("give group or offset_store, not both")
        if start not in ("earliest", "latest"):
            raise ValueError(f"start must be 'earliest' or 'latest', not {start!r}")
        if not 1 <= max_poll_messages <= 10_000:
            raise ValueError("max_poll_messages must be 1 to 10000")
        self.topic = topic
        self.group = group
        self._http = Http(url, token, timeout_s=timeout_s, retry=retry or Retry(), transport=transport)
        self._store: OffsetStore | None = GroupOffsetStore(self._http, group) if group is not None else offset_store
        self._fixed_partitions = None if partitions is None else sorted(set(partitions))
        self._start = start
        self._max_poll = max_poll_messages
        self._idle_wait_s = idle_wait_s
        self._positions: dict[int, int] = {}  # next offset to hand out
        self._fetch_pos: dict[int, int] = {}  # next offset to fetch (ahead by what is buffered)
        self._ends: dict[int, int] = {}  # committed end of each partition, as last seen
        self._buffer: deque[Message] = deque()
        self._rotation = 0
        self._metadata_at = -float("inf")
        self._started = False
        self._closed = False

    # -- the public API -----------------------------------------------------------------
    def poll(self, max_messages: int | None = None, timeout_s: float = 0.0) -> list[Message]:
        """Up to `max_messages` messages, waiting up to `timeout_s` for the first; [] if none came.

        Messages of one partition come in offset order; partitions take turns.
        """
        self._check_open()
        self._ensure_started()
        limit = max_messages or self._max_poll
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

    def commit(self, positions: Mapping[int, int] | None = None) -> dict[int, int]:
        """Save the positions (default: past every message handed out so far); returns what was saved."""
        self._check_open()
        if self._store is None:
            raise ClientError("this consumer has nowhere to commit: give it a group or an offset_store")
        self._ensure_started()
        saved = dict(positions) if positions is not None else self.positions()
        self._store.save(self.topic, saved)
        return saved

    def positions(self) -> dict[int, int]:
        """The next offset to hand out, per assigned partition."""
        self._ensure_started()
        return dict(self._positions)

    def lag(self) -> dict[int, int]:
        """Messages committed to the table and not yet handed out, per partition, as last seen."""
        return {p: max(0, self._ends.get(p, pos) - pos) for p, pos in self.positions().items()}

    def seek(self, partition: int, offset: int) -> None:
        """Hand out `partition` from `offset` next (a later commit() saves it)."""
        self._ensure_started()
        if partition not in self._positions:
            raise ValueError(f"partition {partition} is not assigned to this consumer")
        self._buffer = deque(m for m in self._buffer if m.partition != partition)
        self._positions[partition] = self._fetch_pos[partition] = offset

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

    def _topic_path(self) -> str:
        return f"/v1/topics/{quote(self.topic, safe='')}"

    def _metadata(self) -> dict[int, dict[str, Any]]:
        response = self._http.request("GET", self._topic_path())
        if not response.is_success:
            raise refused(response, f"describe topic {self.topic!r}")
        self._metadata_at = time.monotonic()
        return {p["partition"]: p for p in response.json()["partition_offsets"]}

    def _ensure_started(self) -> None:
        if self._started:
            if self._fixed_partitions is None and time.monotonic() - self._metadata_at > METADATA_MAX_AGE_S:
                self._assign_new(self._metadata(), new_partitions=True)
            return
        info = self._metadata()
        if self._fixed_partitions is not None:
            unknown = [p for p in self._fixed_partitions if p not in info]
            if unknown:
                raise ValueError(f"topic {self.topic!r} has no partition {unknown[0]} ({len(info)} partitions)")
        self._assign_new(info, new_partitions=False)
        self._started = True

    def _assign_new(self, info: dict[int, dict[str, Any]], *, new_partitions: bool) -> None:
        wanted = [p for p in (self._fixed_partitions or sorted(info)) if p not in self._positions]
        if not wanted:
            return
        saved = self._store.load(self.topic) if self._store is not None else {}
        for p in wanted:
            if p in saved:
                position = saved[p]
            elif new_partitions or self._start == "earliest":  # a partition added later starts at its beginning
                position = info[p]["log_start_offset"]
            else:
                position = info[p]["committed_offset"]
            self._positions[p] = self._fetch_pos[p] = position
            self._ends[p] = info[p]["committed_offset"]

    # -- fetching -----------------------------------------------------------------------
    def _fill(self) -> None:
        """One round over the partitions, starting one further each time, until max_poll_messages."""
        parts = sorted(self._fetch_pos)
        if not parts:
            return
        self._rotation = (self._rotation + 1) % len(parts)
        room = self._max_poll
        for p in parts[self._rotation:] + parts[:self._rotation]:
            if room <= 0:
                break
            got = self._fetch(p, room)
            room -= got
        self._catch_up()

    def _fetch(self, partition: int, limit: int) -> int:
        offset = self._fetch_pos[partition]
        response = self._http.request("GET", f"{self._topic_path()}/partitions/{partition}/messages",
                                      params={"offset": offset, "limit": limit})
        if response.status_code == 416:
            self._out_of_range(partition, offset)
            return 0
        if not response.is_success:
            raise refused(response, f"read topic {self.topic!r} partition {partition}")
        body = response.json()
        for m in body["messages"]:
            self._buffer.append(Message.model_validate({**m, "topic": self.topic}))
        self._fetch_pos[partition] = body["next_offset"]
        self._ends[partition] = body["committed_offset"]
        return len(body["messages"])

    def _out_of_range(self, partition: int, offset: int) -> None:
        info = self._metadata()[partition]
        start, committed, end = info["log_start_offset"], info["committed_offset"], info["log_end_offset"]
        if offset < start:
            log.warning("topic %s partition %d: offsets %d-%d were removed by retention before this consumer "
                        "read them; continuing at %d", self.topic, partition, offset, start - 1, start)
            target = start
        elif offset <= end:
            return  # accepted by the broker but not in the table yet: read it next round
        else:
            target = start if self._start == "earliest" else committed
            log.warning("topic %s partition %d: position %d is past the log end %d (a restored or failed-over "
                        "broker?); resetting to %s offset %d", self.topic, partition, offset, end, self._start,
                        target)
        self._fetch_pos[partition] = self._positions[partition] = target
        self._ends[partition] = committed

    def _take(self, limit: int) -> list[Message]:
        out = [self._buffer.popleft() for _ in range(min(limit, len(self._buffer)))]
        for m in out:
            self._positions[m.partition] = m.offset + 1
        self._catch_up()
        return out

    def _catch_up(self) -> None:
        """A partition with nothing buffered is positioned at its fetch position (past compaction holes)."""
        buffered = {m.partition for m in self._buffer}
        for p, pos in self._fetch_pos.items():
            if p not in buffered:
                self._positions[p] = pos
