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
- **An answer before the body.** A refusal made from the head alone (401, 404, 413) is answered
  before the body is read. The rest of that body is then read and dropped under the body deadline
  (`body_read_timeout_s`): the connection closes if it does not arrive in time, and once it has
  arrived the connection is idle and the keep-alive timeout applies. So every open connection is
  always under some deadline.

On the hot path a request that arrives in one read costs a few attribute writes: no timer is
armed for it (one per connection, cancelled when the first head completes).

The fast produce path (ingest_api/http_fast_produce.py) is a subclass; these hooks are where it
takes a request before uvicorn's code does: `_begin_message`, `_take_head`, `_complete_message`.
"""

from __future__ import annotations

import asyncio

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from lakebroker.ingest_api.limits import MAX_HEADER_BYTES
from lakebroker.ingest_api.responses import Answer, json_answer
from lakebroker.tables.errors import HeadersTooLarge, LakebrokerError, RequestTimeout
from lakebroker.tables.settings import Settings

MAX_REQUEST_LINE_BYTES = 8 * 1024  # nginx's large_client_header_buffers
MAX_HEAD_BYTES = MAX_HEADER_BYTES + MAX_REQUEST_LINE_BYTES
HEADER_TIMEOUT_S: float = Settings.model_fields["header_read_timeout_s"].default
BODY_TIMEOUT_S: float = Settings.model_fields["body_read_timeout_s"].default
# A body of a declared length up to this reaches the app in one piece, as read_body would make
# it anyway: no flow-control pause and app wake-up per 64 KiB read (the default request limit;
# a longer body streams as uvicorn streams it, and ingest_api/limits.py bounds both).
WHOLE_BODY_BYTES = 32 * 1024 * 1024


class _DefaultHeaders:
    """uvicorn's default headers as bytes, joined again only when uvicorn replaces the list (each
    second, for the date)."""

    def __init__(self) -> None:
        self.source: list[tuple[bytes, bytes]] | None = None
        self.lines = b""

    def of(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        if headers is not self.source:
            self.lines = b"".join([b"%s: %s\r\n" % header for header in headers])
            self.source = headers
        return self.lines


_DEFAULTS = _DefaultHeaders()


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    max_head_bytes: int = MAX_HEAD_BYTES

    _deadline: asyncio.TimerHandle | None = None
    _idle = True  # between messages: the next byte begins a request head
    _in_head = False  # part of a head has arrived, not its end
    _head_bytes = 0  # of the head in progress, counted from reads that held nothing else
    _heads = 0  # request heads completed on this connection
    _message_done = True  # the request in progress has its whole body (or there is none in progress)
    _drain: asyncio.TimerHandle | None = None  # the deadline of a body left unread by an early answer
    _parts: list[bytes] | None = None  # the reads so far of a body of at most WHOLE_BODY_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        super().connection_lost(exc)

    # -- keep-alive: one timer per connection -----------------------------------------------
    # uvicorn arms a keep-alive timer at every response and cancels it at the next read: a timer
    # made and unmade per request. Here the timer stays armed while the connection lives, and
    # when it fires it looks at how long the connection has been idle (uvicorn's rule: closed
    # once timeout_keep_alive has passed since the last response, with no request begun).
    _idle_from: float | None = None  # when the last response completed with nothing behind it

    def _unset_keepalive_if_required(self) -> None:
        self._idle_from = None

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_from = None
        self.flow.resume_reading()
        if self.pipeline:  # uvicorn's: start the request queued behind this one
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        if not self._message_done:  # answered from the head: the body's rest has its deadline, then idles
            self._drain = self.loop.call_later(self.body_timeout_s, self._drain_timed_out)
            return
        self._idle_now()

    def _idle_now(self) -> None:
        self._idle_from = now = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_at(now + self.timeout_keep_alive, self._keep_alive_due)

    def _drain_timed_out(self) -> None:
        self._drain = None
        if not self._message_done:
            self.transport.close()  # its answer is out; the rest of the request never came

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        idle_from = self._idle_from
        if idle_from is None:
            return  # a request is in progress: its response arms the timer again
        due = idle_from + self.timeout_keep_alive
        if self.loop.time() >= due:
            self.timeout_keep_alive_handler()
        else:
            self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_due)

    # -- request heads: their size and deadline ---------------------------------------------
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
        self._begin_message()
        self._idle, self._in_head, self._head_bytes, self._message_done = False, True, 0, False
        self._parts = None

    def _begin_message(self) -> None:
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        if self._deadline is not None:
            self._disarm()
        self._take_head()

    def _take_head(self) -> None:
        """The head is whole: uvicorn builds its request cycle and starts the app."""
        super().on_headers_complete()
        self._parts = [] if 0 <= _declared_length(self.headers) <= WHOLE_BODY_BYTES else None

    def on_body(self, body: bytes) -> None:
        parts = self._parts
        if parts is not None and not self.cycle.response_complete and not self.parser.should_upgrade():
            # uvicorn's on_body, without its pause at 64 KiB and its wake-up of the app per read:
            # the app's receive() wakes once, at on_message_complete, with the whole body. The
            # reads are kept as they come and joined once: appending to uvicorn's bytearray
            # copies each read again as the array grows, and receive() copies the array once more
            # (bytes() of a bytes object is that object).
            parts.append(body)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._parts and not self.cycle.response_complete:
            self.cycle.body = b"".join(self._parts)  # type: ignore[assignment]
        self._parts = None
        self._message_done = True
        self._complete_message()
        self._idle = True
        if self._drain is not None:  # the body an early answer left unread is in: the connection idles
            self._drain.cancel()
            self._drain = None
            if self.cycle.response_complete and not self.pipeline:  # (not if this is a later request's body)
                self._idle_now()

    def _complete_message(self) -> None:
        super().on_message_complete()

    # -- answers written here ---------------------------------------------------------------
    def _rendered(self, answer: Answer, keep_alive: bool) -> tuple[bytes, bool]:
        """`answer` as uvicorn's RequestResponseCycle.send writes a response (its default headers
        first, `connection: close` when the connection ends), and whether the connection stays open."""
        head = [STATUS_LINE[answer.status], _DEFAULTS.of(self.server_state.default_headers)]
        closing = False
        for name, value in answer.headers:
            if name == b"connection" and b"close" in [token.strip() for token in value.lower().split(b",")]:
                closing = True
            head.append(b"%s: %s\r\n" % (name, value))
        if not keep_alive and not closing:
            head.append(b"connection: close\r\n")
        head += [b"\r\n", answer.body]
        return b"".join(head), keep_alive and not closing

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
        data, _ = self._rendered(json_answer(error.status, body), keep_alive=False)
        self.transport.write(data)
        self.transport.close()


def bounded_protocol(header_timeout_s: float, body_timeout_s: float = BODY_TIMEOUT_S) -> type[BoundedHttpToolsProtocol]:
    """The protocol class with these deadlines (the class itself for the defaults)."""
    base = BoundedHttpToolsProtocol
    if header_timeout_s == base.header_timeout_s and body_timeout_s == base.body_timeout_s:
        return base
    return type(base.__name__, (base,), {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s})


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The request's content-length, or -1 without one (a chunked body) or with a bad one."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else -1
    return -1
