"""An HTTP/1.1 keep-alive load generator on raw asyncio sockets, run as its own process.

It does what wrk cannot express: an open loop at a steady rate that records, per request, when
it was due, when it was sent, when it was answered, and the partition and offset of the answer
(the produce→visible benchmark joins these with bench.poller's observations). It also runs a
closed loop (N connections, back to back) where wrk is missing.

Every run is bounded by --duration and --max-requests. Times are time.monotonic(), which on
Linux is CLOCK_MONOTONIC and so comparable across processes on one machine. In an open loop,
latency counts from the due time, so a late send is charged to the server (no coordinated
omission).

    python -m bench.loadgen --url http://127.0.0.1:8080/v1/topics/t/messages \\
        --body-template '{"value": {"seq": {seq}}}' --rate 200 --duration 10 \\
        --max-requests 2000 --out results.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson


class HttpError(Exception):
    pass


@dataclass
class Sample:
    due: float
    sent: float
    done: float
    status: int
    partition: int | None = None
    offset: int | None = None


@dataclass
class Target:
    host: str
    port: int
    path: str
    content_type: str
    body: bytes | None = None
    template: str | None = None  # "{seq}" is replaced by the request's sequence number

    def request(self, seq: int) -> bytes:
        body = self.body if self.template is None else self.template.replace("{seq}", str(seq)).encode()
        assert body is not None
        head = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: {self.content_type}\r\nContent-Length: {len(body)}\r\n\r\n")
        return head.encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if length is not None:
        return status, await reader.readexactly(length)
    if not chunked:
        raise HttpError("response has neither content-length nor chunked encoding")
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return status, b"".join(parts)
        parts.append(data[:-2])


@dataclass
class Connection:
    target: Target
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    async def exchange(self, payload: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.target.host, self.target.port)
        assert self.reader is not None
        self.writer.write(payload)
        await self.writer.drain()
        return await read_response(self.reader)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@dataclass
class Run:
    target: Target
    duration: float
    max_requests: int
    record_body: bool = False
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    _seq: int = 0

    def _next_seq(self) -> int | None:
        if self._seq >= self.max_requests:
            return None
        self._seq += 1
        return self._seq - 1

    async def _one(self, conn: Connection, seq: int, due: float) -> None:
        sent = time.monotonic()
        try:
            status, body = await conn.exchange(self.target.request(seq))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, HttpError, ValueError):
            conn.close()
            self.errors += 1
            self.samples.append(Sample(due, sent, time.monotonic(), 0))
            return
        sample = Sample(due, sent, time.monotonic(), status)
        if not 200 <= status < 400:
            self.errors += 1
        elif self.record_body:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                answer = orjson.loads(body)
                sample.partition, sample.offset = answer["partition"], answer["offset"]
        self.samples.append(sample)

    async def closed(self, connections: int) -> None:
        end = time.monotonic() + self.duration

        async def worker() -> None:
            conn = Connection(self.target)
            try:
                while time.monotonic() < end and (seq := self._next_seq()) is not None:
                    await self._one(conn, seq, time.monotonic())
            finally:
                conn.close()

        await asyncio.gather(*(worker() for _ in range(connections)))

    async def open(self, rate: float, connections: int) -> None:
        idle: asyncio.Queue[Connection] = asyncio.Queue()
        for _ in range(connections):
            idle.put_nowait(Connection(self.target))
        start = time.monotonic()
        end = start + self.duration
        tasks: set[asyncio.Task[None]] = set()

        async def send(seq: int, due: float) -> None:
            conn = await idle.get()
            try:
                await self._one(conn, seq, due)
            finally:
                idle.put_nowait(conn)

        i = 0
        while (due := start + i / rate) < end and (seq := self._next_seq()) is not None:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(send(seq, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        while not idle.empty():
            idle.get_nowait().close()

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {"requests": 0, "errors": self.errors, "duration_s": 0.0, "p50_ms": 0.0, "p90_ms": 0.0,
                    "p99_ms": 0.0}
        latencies = sorted(s.done - s.due for s in self.samples)
        span = max(s.done for s in self.samples) - min(s.due for s in self.samples)

        def pct(q: float) -> float:
            return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3

        return {"requests": len(self.samples), "errors": self.errors, "duration_s": span,
                "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="HTTP/1.1 keep-alive POST load, open or closed loop.")
    parser.add_argument("--url", required=True)
    body = parser.add_mutually_exclusive_group(required=True)
    body.add_argument("--body-file", type=Path)
    body.add_argument("--body-template", help="the body, with {seq} replaced by a per-request number")
    parser.add_argument("--content-type", default="application/json")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rate", type=float, help="open loop at this many requests/s (default: closed loop)")
    parser.add_argument("--duration", type=float, required=True, help="seconds")
    parser.add_argument("--max-requests", type=int, required=True)
    parser.add_argument("--record-body", action="store_true", help="keep partition/offset of each answer")
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    url = urlsplit(args.url)
    path = url.path + (f"?{url.query}" if url.query else "")
    target = Target(url.hostname or "127.0.0.1", url.port or 80, path, args.content_type,
                    body=args.body_file.read_bytes() if args.body_file else None, template=args.body_template)
    run = Run(target, args.duration, args.max_requests, record_body=args.record_body)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    if args.rate:
        runner(run.open(args.rate, args.connections))
    else:
        runner(run.closed(args.connections))
    out: dict[str, Any] = {"summary": run.summary()}
    if not args.summary_only:
        out["samples"] = [[s.due, s.sent, s.done, s.status, s.partition, s.offset] for s in run.samples]
    args.out.write_bytes(orjson.dumps(out))


if __name__ == "__main__":
    main()
