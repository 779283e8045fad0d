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

**Fast produce.** With a `FastProduce` (ingest_api/fast_produce.py), a plain single-message
produce (`POST /v1/topics/{topic}/messages` with a content-length body, nothing else in progress
on the connection, and uvicorn's access log off) is answered here rather than through ASGI. While it is in
progress a `FastCycle` stands in `self.cycle`, with the attributes uvicorn's own code reads there
(pipelining, disconnects, graceful shutdown), and its answer ends with uvicorn's
`on_response_complete`, which starts any request queued behind it. No task runs it: the answer
is written by the callback the WAL writer's report makes (ack=table alone takes a task, to await
the Delta commit too). A body that does not arrive
with its head gets the body_read_timeout_s deadline (408); one that does pays for no timer.
Anything else takes uvicorn's ASGI path unchanged. tests/cli/test_uvicorn_internals.py pins the
uvicorn code this relies on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import cast

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from lakebroker.ingest_api.broker import OneMessage
from lakebroker.ingest_api.fast_produce import FastProduce, FastRequest
from lakebroker.ingest_api.limits import MAX_HEADER_BYTES
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.responses import Answer, json_answer
from lakebroker.tables.errors import HeadersTooLarge, LakebrokerError, RequestTimeout
from lakebroker.tables.settings import Settings

MAX_REQUEST_LINE_BYTES = 8 * 1024  # nginx's large_client_header_buffers
MAX_HEAD_BYTES = MAX_HEADER_BYTES + MAX_REQUEST_LINE_BYTES
HEADER_TIMEOUT_S: float = Settings.model_fields["header_read_timeout_s"].default
BODY_TIMEOUT_S: float = Settings.model_fields["body_read_timeout_s"].default
_FAST_PREFIX = b"/v1/topics/"
# A body of a declared length up to this reaches the app in one piece, as read_body would make
# it anyway: no flow-control pause and app wake-up per 64 KiB read (the default request limit;
# a longer body streams as uvicorn streams it, and ingest_api/limits.py bounds both).
WHOLE_BODY_BYTES = 32 * 1024 * 1024
# Starlette's answer to an exception in the app, after which uvicorn closes the connection
_SERVER_ERROR = Answer(500, [(b"content-length", b"21"), (b"content-type", b"text/plain; charset=utf-8"),
                             (b"connection", b"close")], b"Internal Server Error")


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


class _NoEvent:
    """uvicorn sets a cycle's message_event on a disconnect; a fast request waits on no event."""

    def set(self) -> None:
        pass


class FastCycle:
    """`self.cycle` while the fast path answers a request: what uvicorn reads and writes of a
    RequestResponseCycle outside the cycle's own code."""

    __slots__ = ("chunks", "disconnected", "keep_alive", "one", "request", "response_complete", "started", "timer")
    message_event = _NoEvent()

    def __init__(self, keep_alive: bool) -> None:
        self.request: FastRequest | None = None
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.chunks: list[bytes] = []
        self.started = False  # the whole body is in and the produce runs
        self.timer: asyncio.TimerHandle | None = None  # the body deadline, once a read ended without the body
        self.one: OneMessage | None = None  # the message it waits for (ack=wal)


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
    fast: FastProduce | None = None  # serves single-message produce below ASGI
    _whole_body = False  # the request in progress declared a body of at most WHOLE_BODY_BYTES
    _fast: FastProduce | None = None  # on this connection
    cycle: RequestResponseCycle | FastCycle  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # the fast path writes no access log: it serves only where uvicorn's would write nothing
        self._fast = None if self.access_log and self.access_logger.isEnabledFor(logging.INFO) else self.fast
        self._deadline = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None
        cycle = self.cycle
        if type(cycle) is FastCycle and cycle.timer is not None:
            cycle.timer.cancel()
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

    def data_received(self, data: bytes) -> None:
        whole = self._idle or self._in_head  # this read starts at or inside a head
        heads = self._heads
        super().data_received(data)
        cycle = self.cycle
        if type(cycle) is FastCycle and cycle.request is not None and not cycle.started and cycle.timer is None \
                and not cycle.response_complete and self.fast is not None:
            cycle.timer = self.loop.call_later(self.fast.body_timeout_s, self._body_timed_out, cycle)
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
        if self._fast is None:
            super().on_message_begin()
        else:  # uvicorn's, but its ASGI scope is built only for a request that takes the ASGI path
            self.url = b""
            self.expect_100_continue = False
            self.headers = []
        self._idle, self._in_head, self._head_bytes, self._message_done = False, True, 0, False

    def _asgi_scope(self) -> None:
        """The scope uvicorn's on_message_begin builds (tests/cli/test_uvicorn_internals.py pins it)."""
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        if self._deadline is not None:
            self._disarm()
        if self._fast is None or not self._fast_head(self._fast):
            if self._fast is not None:
                self._asgi_scope()
            super().on_headers_complete()
            self._whole_body = 0 <= _declared_length(self.headers) <= WHOLE_BODY_BYTES

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is FastCycle:
            if not cycle.response_complete:
                cycle.chunks.append(body)
            return
        if self._whole_body and not cycle.response_complete and not self.parser.should_upgrade():
            # uvicorn's on_body, without its pause at 64 KiB and its wake-up of the app per read:
            # the app's receive() wakes once, at on_message_complete, with the whole body. The body
            # is a bytearray, so each read appends in place (linear in the body, not quadratic).
            cast(RequestResponseCycle, cycle).body += body
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._message_done = True
        cycle = self.cycle
        if type(cycle) is FastCycle:
            if cycle.request is not None and not cycle.response_complete and not cycle.started:
                self._fast_body(cycle)
        else:
            super().on_message_complete()
        self._idle = True
        if self._drain is not None:  # the body an early answer left unread is in: the connection idles
            self._drain.cancel()
            self._drain = None
            if self.cycle.response_complete and not self.pipeline:  # (not if this is a later request's body)
                self._idle_now()

    # -- fast produce ---------------------------------------------------------------------
    def _fast_head(self, fast: FastProduce) -> bool:
        """Takes a request on the fast path if it is a plain single-message produce (True)."""
        url: bytes = self.url
        parser = self.parser
        cycle = self.cycle
        if not url.startswith(_FAST_PREFIX) or parser.get_method() != b"POST" or self.expect_100_continue \
                or self.pipeline or self.root_path or (cycle is not None and not cycle.response_complete):
            return False
        version = parser.get_http_version()
        if (version != "1.1" and version != "1.0") or parser.should_upgrade():
            return False
        limit = self.limit_concurrency  # over it, uvicorn answers 503
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            return False
        path, _, query = url.partition(b"?")
        parts = path.split(b"/")  # b"", b"v1", b"topics", topic, b"messages"
        if len(parts) != 5 or parts[4] != b"messages" or not parts[3] or b"%" in path or b"#" in url \
                or not parts[3].isascii():
            return False
        # (a body with no declared length, or a chunked one, takes uvicorn's path: begin says None)
        outcome = fast.begin(parts[3].decode("ascii"), query, self.headers)
        if outcome is None:
            return False
        cycle = FastCycle(keep_alive=version != "1.0" and parser.should_keep_alive())
        self.cycle = cycle  # uvicorn reads only what FastCycle holds
        if isinstance(outcome, Answer):
            self._fast_answer(cycle, outcome)  # the body, if any, is dropped as uvicorn drops it
        else:
            cycle.request = outcome
        return True

    def _fast_body(self, cycle: FastCycle) -> None:
        assert cycle.request is not None and self.fast is not None
        cycle.started = True
        if cycle.timer is not None:
            cycle.timer.cancel()
            cycle.timer = None
        chunks = cycle.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        cycle.chunks = []
        try:
            outcome = self.fast.start(cycle.request, body, functools.partial(self._fast_done, cycle))
        except Exception as exc:  # noqa: BLE001 - as uvicorn answers an exception in the app
            self._fast_failed(cycle, exc)
            return
        if isinstance(outcome, Answer):
            self._fast_answer(cycle, outcome)
        elif outcome.ack is not AckMode.TABLE:
            cycle.one = outcome  # the common case, ack=wal: the WAL write's callback calls _fast_done, no task
        else:
            task = self.loop.create_task(self._fast_settle(cycle, outcome))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)  # uvicorn's graceful shutdown and concurrency limit count it

    def _fast_done(self, cycle: FastCycle) -> None:
        assert self.fast is not None and cycle.one is not None
        try:
            answer = self.fast.finish(cycle.one)
        except BaseException as exc:  # noqa: BLE001 - logged there; a cancelled group included
            self._fast_failed(cycle, exc)
            return
        self._fast_answer(cycle, answer)

    async def _fast_settle(self, cycle: FastCycle, one: OneMessage) -> None:
        assert self.fast is not None
        try:
            answer = await self.fast.settle(one)
        except BaseException as exc:  # noqa: BLE001 - as uvicorn's run_asgi, cancellation included; logged there
            self._fast_failed(cycle, exc)
            return
        self._fast_answer(cycle, answer)

    def _fast_failed(self, cycle: FastCycle, exc: BaseException) -> None:
        self.logger.error("Exception in fast produce\n", exc_info=exc)
        self._fast_answer(cycle, _SERVER_ERROR)

    def _body_timed_out(self, cycle: FastCycle) -> None:
        cycle.timer = None
        if not cycle.started and not cycle.response_complete and self.fast is not None:
            self._fast_answer(cycle, self.fast.timed_out())

    def _fast_answer(self, cycle: FastCycle, answer: Answer) -> None:
        """Writes `answer` as uvicorn's RequestResponseCycle.send writes a response, then lets uvicorn
        start what waits behind it."""
        cycle.response_complete = True
        transport = self.transport
        if transport.is_closing():  # the client left (or the connection was refused): nothing to write
            return
        data, cycle.keep_alive = self._rendered(answer, cycle.keep_alive)
        transport.write(data)
        if not cycle.keep_alive:
            transport.close()
        self.on_response_complete()

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


def bounded_protocol(header_timeout_s: float, fast: FastProduce | None = None,
                     body_timeout_s: float = BODY_TIMEOUT_S) -> type[BoundedHttpToolsProtocol]:
    """The protocol class with these deadlines and fast produce path (the base class for the defaults)."""
    base = BoundedHttpToolsProtocol
    if header_timeout_s == base.header_timeout_s and body_timeout_s == base.body_timeout_s and fast is None:
        return base
    return type(base.__name__, (base,),
                {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s, "fast": fast})


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The request's content-length, or -1 without one (a chunked body) or with a bad one."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else -1
    return -1
