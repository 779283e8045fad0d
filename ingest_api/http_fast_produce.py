"""Single-message produce answered by the HTTP protocol itself, below ASGI.

With a `FastProduce` (ingest_api/fast_produce.py), a plain single-message
produce (`POST /v1/topics/{topic}/messages` with a content-length body, nothing else in progress
on the connection, and uvicorn's access log off) is answered here rather than through ASGI. While it is in
progress a `FastCycle` stands in `self.cycle`, with the attributes uvicorn's own code reads there
(pipelining, disconnects, graceful shutdown), and its answer ends with uvicorn's
`on_response_complete`, which starts any request queued behind it. No task runs it: the answer
is written by the callback the WAL writer's report makes (ack=table alone takes a task, to await
the Delta commit too). A body that does not arrive
with its head gets the body_read_timeout_s deadline (408); one that does pays for no timer.
Anything else takes uvicorn's ASGI path unchanged (ingest_api/http_limits.py's protocol,
which this one extends). The setting `fast_produce` turns it off. tests/cli/test_uvicorn_internals.py pins the
uvicorn code this relies on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from lakebroker.ingest_api.fast_produce import FastProduce, FastRequest
from lakebroker.ingest_api.http_limits import BODY_TIMEOUT_S, BoundedHttpToolsProtocol
from lakebroker.ingest_api.local_produce import OneMessage
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.responses import Answer

_FAST_PREFIX = b"/v1/topics/"
# Starlette's answer to an exception in the app, after which uvicorn closes the connection
_SERVER_ERROR = Answer(500, [(b"content-length", b"21"), (b"content-type", b"text/plain; charset=utf-8"),
                             (b"connection", b"close")], b"Internal Server Error")


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


class FastProduceProtocol(BoundedHttpToolsProtocol):
    fast: FastProduce | None = None  # serves single-message produce below ASGI
    _fast: FastProduce | None = None  # on this connection
    cycle: RequestResponseCycle | FastCycle  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # the fast path writes no access log: it serves only where uvicorn's would write nothing
        super().connection_made(transport)
        self._fast = None if self.access_log and self.access_logger.isEnabledFor(logging.INFO) else self.fast

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        if type(cycle) is FastCycle and cycle.timer is not None:
            cycle.timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self.cycle
        if type(cycle) is FastCycle and cycle.request is not None and not cycle.started and cycle.timer is None \
                and not cycle.response_complete and self.fast is not None and not self.transport.is_closing():
            cycle.timer = self.loop.call_later(self.fast.body_timeout_s, self._body_timed_out, cycle)

    def _begin_message(self) -> None:
        if self._fast is None:
            super()._begin_message()
        else:  # uvicorn's, but its ASGI scope is built only for a request that takes the ASGI path
            self.url = b""
            self.expect_100_continue = False
            self.headers = []

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

    def _take_head(self) -> None:
        if self._fast is None or not self._fast_head(self._fast):
            if self._fast is not None:
                self._asgi_scope()
            super()._take_head()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is FastCycle:
            if not cycle.response_complete:
                cycle.chunks.append(body)
            return
        super().on_body(body)

    def _complete_message(self) -> None:
        cycle = self.cycle
        if type(cycle) is FastCycle:
            if cycle.request is not None and not cycle.response_complete and not cycle.started:
                self._fast_body(cycle)
        else:
            super()._complete_message()

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
        elif not isinstance(outcome, OneMessage):  # forwarded to the partition's owner
            self._fast_task(cycle, outcome)
        elif outcome.ack is not AckMode.TABLE:
            cycle.one = outcome  # ack=wal and ack=none: the group committer calls _fast_done, no task
        else:
            self._fast_task(cycle, self.fast.settle(outcome))

    def _fast_task(self, cycle: FastCycle, answer: Coroutine[Any, Any, Answer]) -> None:
        task = self.loop.create_task(self._fast_await(cycle, answer))
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

    async def _fast_await(self, cycle: FastCycle, pending: Coroutine[Any, Any, Answer]) -> None:
        try:
            answer = await pending
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



def fast_protocol(header_timeout_s: float, fast: FastProduce,
                  body_timeout_s: float = BODY_TIMEOUT_S) -> type[FastProduceProtocol]:
    """The protocol class with these deadlines that answers single-message produce with `fast`."""
    base = FastProduceProtocol
    return type(base.__name__, (base,),
                {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s, "fast": fast})
