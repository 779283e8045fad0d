"""`Batching` (the producer's knobs) and the accumulator that turns sends into /batch requests.

Many threads append; the producer's one sender thread takes batches in the order they were
sealed. A batch is sealed when it is full (`max_messages` or `max_bytes`), when its first
message has waited `linger_ms`, or when flush()/close() ask for everything now.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from lakebroker_client._exceptions import BufferFull, ClientClosed
from lakebroker_client._models import AckMode, SendResult

MAX_BATCH_MESSAGES = 100_000  # the broker's limit per request


@dataclass(frozen=True)
class Batching:
    """How the producer groups messages into requests (one request per topic and ack mode).

    linger_ms: longest a message waits for others to join its batch (0: send at once).
    max_messages / max_bytes: a batch this big is sent without waiting (bytes of message JSON;
        keep max_bytes well under the broker's max_request_bytes, 32 MiB by default).
    buffer_messages: most messages waiting or in flight; past it send() blocks...
    block_s: ...for at most this long, then raises BufferFull.
    """

    linger_ms: float = 5.0
    max_messages: int = 1000
    max_bytes: int = 1024 * 1024
    buffer_messages: int = 100_000
    block_s: float = 60.0

    def __post_init__(self) -> None:
        if self.linger_ms < 0:
            raise ValueError(f"Batching.linger_ms must be >= 0, not {self.linger_ms}")
        if not 1 <= self.max_messages <= MAX_BATCH_MESSAGES:
            raise ValueError(f"Batching.max_messages must be 1 to {MAX_BATCH_MESSAGES}, not {self.max_messages}")
        if self.max_bytes < 1:
            raise ValueError(f"Batching.max_bytes must be positive, not {self.max_bytes}")
        if self.buffer_messages < self.max_messages:
            raise ValueError("Batching.buffer_messages must be at least max_messages")
        if self.block_s < 0:
            raise ValueError(f"Batching.block_s must be >= 0, not {self.block_s}")


@dataclass(slots=True)
class Pending:
    fragment: bytes  # the message as JSON, encoded once in send()
    future: Future[SendResult]
    partition: int | None = None  # explicit
    route: str | None = None  # what picks its partition otherwise: its key, else its id (_routing.py)


@dataclass
class Batch:
    topic: str
    ack: AckMode
    created: float
    items: list[Pending] = field(default_factory=list)
    size: int = 0

    def body(self) -> bytes:
        return b'{"messages":[' + b",".join(p.fragment for p in self.items) + b"]}"


class Accumulator:
    def __init__(self, batching: Batching) -> None:
        self.batching = batching
        self._cond = threading.Condition()
        self._open: dict[tuple[str, AckMode], Batch] = {}
        self._ready: deque[Batch] = deque()
        self._buffered = 0  # appended and not yet finished
        self._closed = False

    def append(self, topic: str, ack: AckMode, item: Pending) -> None:
        b = self.batching
        with self._cond:
            if self._buffered >= b.buffer_messages:
                deadline = time.monotonic() + b.block_s
                while self._buffered >= b.buffer_messages and not self._closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise BufferFull(f"{self._buffered} messages wait to be sent (Batching.buffer_messages); "
                                         f"no room within {b.block_s:g} s: is the broker reachable?")
                    self._cond.wait(remaining)
            if self._closed:
                raise ClientClosed("the producer is closed")
            key = (topic, ack)
            batch = self._open.get(key)
            if batch is not None and batch.items and batch.size + len(item.fragment) > b.max_bytes:
                self._seal(key)
                batch = None
            if batch is None:
                batch = self._open[key] = Batch(topic, ack, time.monotonic())
            batch.items.append(item)
            batch.size += len(item.fragment)
            self._buffered += 1
            if len(batch.items) >= b.max_messages or batch.size >= b.max_bytes or b.linger_ms == 0:
                self._seal(key)
            self._cond.notify_all()

    def _seal(self, key: tuple[str, AckMode]) -> None:
        self._ready.append(self._open.pop(key))

    def seal_all(self) -> None:
        """Everything waiting is sent now (flush)."""
        with self._cond:
            for key in list(self._open):
                self._seal(key)
            self._cond.notify_all()

    def next_ready(self) -> Batch | None:
        """The next batch to send, waiting for one; None once closed and empty."""
        linger = self.batching.linger_ms / 1000
        with self._cond:
            while True:
                now = time.monotonic()
                for key, batch in list(self._open.items()):
                    if now - batch.created >= linger:
                        self._seal(key)
                if self._ready:
                    return self._ready.popleft()
                if self._closed and not self._open:
                    return None
                oldest = min((b.created for b in self._open.values()), default=None)
                self._cond.wait(None if oldest is None else max(0.0, oldest + linger - now))

    def done(self, count: int) -> None:
        with self._cond:
            self._buffered -= count
            self._cond.notify_all()

    def close(self) -> None:
        """No more appends; what is waiting is sealed and will still be sent."""
        with self._cond:
            self._closed = True
            for key in list(self._open):
                self._seal(key)
            self._cond.notify_all()
