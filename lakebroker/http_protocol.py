"""uvicorn's httptools protocol plus the two request-head protections httptools lacks.

- **Size.** httptools buffers an incomplete request line or header without bound (a 4 MiB header
  was answered 200). Here the bytes of a head still incomplete after a read are counted, and over
  `max_head_bytes` the answer is 431 and the connection is closed. A head that completes within
  the reads under that bound reaches the app, where ingest_api/limits.py (HeaderLimit) applies
  the exact header count and size, so the bound leaves room for a request line beside them.
- **Time.** A connection must deliver a whole request head within `header_timeout_s` of opening,
  or of the read that left a later head incomplete (nginx's client_header_timeout), or it is
  closed: with 408 if part of a head arrived, silently if nothing did. A connection idle between
  requests is uvicorn's: its `timeout_keep_alive` closes it, and the first byte of the next head
  ends that idleness, which is when this deadline starts.

On the hot path a request that arrives in one read costs a few attribute writes: no timer is
armed for it (one per connection, cancelled when the first head completes).
"""

from __future__ import annotations

import asyncio
import functools

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ingest_api.limits import MAX_HEADER_BYTES
from tables.errors import HeadersTooLarge, LakebrokerError, RequestTimeout
from tables.settings import Settings

MAX_REQUEST_LINE_BYTES = 8 * 1024  # nginx's large_client_header_buffers
MAX_HEAD_BYTES = MAX_HEADER_BYTES + MAX_REQUEST_LINE_BYTES
HEADER_TIMEOUT_S: float = Settings.model_fields["header_read_timeout_s"].default


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float = HEADER_TIMEOUT_S
    max_head_bytes: int = MAX_HEAD_BYTES

    _deadline: asyncio.TimerHandle | None = None
    _idle = True  # between messages: the next byte begins a request head
    _in_head = False  # part of a head has arrived, not its end
    _head_bytes = 0  # of the head in progress, counted from reads that held nothing else
    _heads = 0  # request heads completed on this connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        whole = self._idle or self._in_head  # this read starts at or inside a head
        heads = self._heads
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        if whole and heads == self._heads:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refuse(HeadersTooLarge(f"the request head is over the server limit of {self.max_head_bytes} "
                                             "bytes"))
                return
        # else the head began after another message's bytes in this read: counting starts with the next
        # read, so the bound may be passed by one read at most
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._idle, self._in_head, self._head_bytes = False, True, 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        if self._deadline is not None:
            self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._idle = True

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._in_head:
            self._refuse(RequestTimeout(f"the request head did not arrive within {self.header_timeout_s:g} s "
                                        "(setting header_read_timeout_s)"))
        else:  # opened and sent nothing: there is no request to answer
            self.transport.close()

    def _refuse(self, error: LakebrokerError) -> None:
        """Answers `error` and closes; if a response is still being written, closes after it instead,
        as answers go out in request order."""
        self._disarm()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False
            self.pipeline.clear()
            self.flow.pause_reading()
            return
        body = orjson.dumps({"error": {"code": error.code, "message": error.message}})
        head = [STATUS_LINE[error.status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()


@functools.cache
def bounded_protocol(header_timeout_s: float) -> type[BoundedHttpToolsProtocol]:
    """The protocol class with this head deadline (the same class for the default)."""
    if header_timeout_s == BoundedHttpToolsProtocol.header_timeout_s:
        return BoundedHttpToolsProtocol
    return type(BoundedHttpToolsProtocol.__name__, (BoundedHttpToolsProtocol,), {"header_timeout_s": header_timeout_s})
