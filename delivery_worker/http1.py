"""A lean HTTP/1.1 keep-alive transport for httpx, for the delivery hot path.

httpx's default transport (httpcore's connection pool) rescans every pooled connection on
each request, so its cost grows with concurrency. This transport keeps a stack of idle
connections per origin (O(1) checkout) and parses responses with httptools, the C parser
uvicorn uses (docs/decisions/0017-webhooks-sent-through-a-lean-http1-transport.md).

It also re-checks the SSRF rule at connect time, on the address it actually dials, so a
webhook host that resolved to a public address at subscription time cannot later rebind
to an internal one.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections import deque
from typing import Any, cast

import httptools
import httpx

from lakebroker.tables.webhook_urls import private_address

MAX_RESPONSE_BODY = 64 * 1024  # we read a receiver's answer only to show it in errors
Origin = tuple[str, str, int]


class _Stale(Exception):
    """A reused connection closed before answering: safe to retry on a fresh one."""


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection that carries one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = time.monotonic()
        self._waiter: asyncio.Future[tuple[int, list[tuple[bytes, bytes]], bytes, bool]] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._body_size = 0
        self._received = False
        self._headers_done = False

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._received = True
        if self._waiter is None:  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None or self._waiter.done():
            return
        if self._headers_done:  # a body delimited by the connection closing
            self._resolve(keep_alive=False)
        elif not self._received:
            self._fail(_Stale())
        else:
            self._fail(httpx.RemoteProtocolError("server closed the connection mid-response"))

    # -- httptools callbacks -------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        if self._body_size < MAX_RESPONSE_BODY:
            self._body.append(body[: MAX_RESPONSE_BODY - self._body_size])
        self._body_size += len(body)

    def on_message_complete(self) -> None:
        self._resolve(keep_alive=self.parser.should_keep_alive())

    # -- use -----------------------------------------------------------------------------
    async def exchange(self, payload: bytes | tuple[bytes, ...], read_timeout: float | None
                       ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._headers, self._body, self._body_size = [], [], 0
        self._received = self._headers_done = False
        if isinstance(payload, bytes):
            self.transport.write(payload)
        else:  # parts written in turn, not joined into one more copy
            self.transport.writelines(payload)
        # call_later, not asyncio.timeout: a plain timer costs less on this path (docs/decisions/0017).
        timer = None if read_timeout is None else asyncio.get_running_loop().call_later(
            read_timeout, self._timed_out, read_timeout)
        try:
            return await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _resolve(self, *, keep_alive: bool) -> None:
        if self._waiter is not None and not self._waiter.done():
            status = self.parser.get_status_code()
            self._waiter.set_result((status, self._headers, b"".join(self._body), keep_alive))

    def _timed_out(self, read_timeout: float) -> None:
        self._fail(httpx.ReadTimeout(f"no response within {read_timeout:g} s"))

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class LeanTransport(httpx.AsyncBaseTransport):
    """Pooled HTTP/1.1 connections, at most `max_per_origin` open to each origin."""

    def __init__(self, *, max_per_origin: int = 256, keepalive_s: float = 30.0, allow_private: bool = False,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.max_per_origin = max_per_origin
        self.keepalive_s = keepalive_s
        self.allow_private = allow_private
        self._ssl = ssl_context
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._slots: dict[Origin, asyncio.Semaphore] = {}
        self._all: set[_Connection] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {url.scheme!r}")
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        payload = _head(request) + await request.aread()
        status, headers, body = await self.exchange(origin_of(url), payload, timeouts)
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(body), request=request)

    async def exchange(self, origin: Origin, payload: bytes | tuple[bytes, ...], timeouts: dict[str, float | None]
                       ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Send one whole request (head and body, as bytes) and read the answer: the delivery hot
        path (sender.py) calls this directly, without building httpx objects."""
        slots = self._slots.get(origin)
        if slots is None:
            slots = self._slots[origin] = asyncio.Semaphore(self.max_per_origin)
        if slots.locked():
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("every connection to the endpoint is busy") from None
        else:
            await slots.acquire()  # a free slot: no timer needed
        try:
            for _ in range(2):
                conn, reused = await self._checkout(origin, timeouts.get("connect"))
                try:
                    status, headers, body, keep_alive = await conn.exchange(payload, timeouts.get("read"))
                except _Stale:
                    self._discard(conn)
                    if reused:
                        continue  # the server closed an idle keep-alive connection: dial again
                    raise httpx.RemoteProtocolError("server closed the connection without answering") from None
                except BaseException:
                    self._discard(conn)
                    raise
                if keep_alive and not conn.closed:
                    conn.idle_since = time.monotonic()
                    self._idle.setdefault(origin, deque()).append(conn)
                else:
                    self._discard(conn)
                return status, headers, body
            raise httpx.RemoteProtocolError("server closed the connection without answering")
        finally:
            slots.release()

    async def _checkout(self, origin: Origin, connect_timeout: float | None) -> tuple[_Connection, bool]:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: least likely to have been closed
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn, True
            self._discard(conn)
        try:
            async with asyncio.timeout(connect_timeout):
                conn = await self._connect(origin)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"could not connect within {connect_timeout:g} s") from None
        except OSError as exc:
            raise httpx.ConnectError(f"could not connect to {origin[1]}:{origin[2]}: {exc}") from None
        self._all.add(conn)
        return conn, False

    async def _connect(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        if not infos:
            raise OSError(f"{host} does not resolve")
        family, _, _, _, address = infos[0]
        ip = str(address[0])
        problem = None if self.allow_private else private_address(host, ip)
        if problem is not None:
            raise httpx.ConnectError(f"refusing to connect: {problem}")
        tls: dict[str, Any] = {}
        if scheme == "https":
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            tls = {"ssl": self._ssl, "server_hostname": host}
        _, conn = await loop.create_connection(_Connection, ip, port, family=family, **tls)
        sock = conn.transport.get_extra_info("socket") if conn.transport else None
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._all.discard(conn)

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()


def origin_of(url: httpx.URL) -> Origin:
    return (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))


def _head(request: httpx.Request) -> bytes:
    raw = request.headers.raw
    fields = b"\r\n".join([name + b": " + value for name, value in raw])
    # One scan for the whole block: a line break inside a name or value would smuggle a header.
    if fields.count(b"\n") != len(raw) - 1 or fields.count(b"\r") != len(raw) - 1:
        raise httpx.LocalProtocolError("a request header holds a line break")
    return b"".join([request.method.encode(), b" ", request.url.raw_path, b" HTTP/1.1\r\n", fields, b"\r\n\r\n"])
