"""uvicorn's h11 protocol plus a deadline for receiving each request's headers.

uvicorn has no such deadline: a connection that never sends a complete request head (a
"slowloris" client trickling one header byte every few seconds) is kept forever, and a few
thousand of them fill `limit_concurrency`, after which every new request gets 503. Here a
connection must deliver a complete request line and headers within `header_timeout_s` of
opening, or of the previous response, or it is closed (nginx's client_header_timeout).
The size of that head is bounded separately by `h11_max_incomplete_event_size`.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0


class BoundedH11Protocol(H11Protocol):
    header_timeout_s: float = HEADER_TIMEOUT_S
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a whole request head has arrived
            self._disarm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_deadline()  # the next request on this keep-alive connection

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.debug("closing a connection that sent no complete request head in %.0f s",
                              self.header_timeout_s)
            self.transport.close()
