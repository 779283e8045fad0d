"""Group commit fairness: a single message queued behind many batches is written in the next
group, not after all of them, and every message still gets a dense offset in request order."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.chunks import CHUNK_SCHEMA, Chunk, chunk_bytes
from lakebroker.ingest_api.group_commit import GroupCommitter, Pending, PendingChunk
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.wal import Wal
from tests.waiting import eventually_async

TOPIC_ID = bytes(range(16))
GROUP = 1_000  # max_group: messages per WAL group


def batch(rows: int) -> PendingChunk:
    columns = pa.Table.from_pylist([{"value": b"v" * 100, "format": "text"}] * rows, schema=CHUNK_SCHEMA)
    return PendingChunk(Chunk("t", TOPIC_ID, 0, -1, 0, columns, chunk_bytes(columns)))


def single(value: bytes) -> Pending:
    return Pending(Record("t", TOPIC_ID, 0, -1, 0, None, value, "text", None, None, None, None))


async def test_a_single_message_behind_a_batch_backlog_joins_the_next_group(tmp_path: Path) -> None:
    wal = Wal(tmp_path / "wal", segment_bytes=1 << 24, fsync=True)
    wal.recover()
    groups: list[list[Record | Chunk]] = []
    committer = GroupCommitter(wal, {}, groups.append, IngestMetrics(CollectorRegistry()), max_group=GROUP)
    batches = [batch(GROUP) for _ in range(5)]  # five groups' worth of batches, queued first
    committer.submit(batches)
    a, b = single(b"a"), single(b"b")
    a.future, b.future = asyncio.get_running_loop().create_future(), asyncio.get_running_loop().create_future()
    committer.submit([a, b])
    await committer.drain()
    wal.close()

    assert groups[0] == [batches[0].chunk, a.record, b.record]  # not behind the other four batches
    assert [g[0] for g in groups[1:]] == [p.chunk for p in batches[1:]]
    assert a.future.result()[:2] == (0, GROUP) and b.future.result()[:2] == (0, GROUP + 1)
    # Offsets stay dense in the order the groups were written: the batches after the singles go on from them.
    assert [p.chunk.offset for p in batches] == [0, GROUP + 2, 2 * GROUP + 2, 3 * GROUP + 2, 4 * GROUP + 2]
    assert committer.queued_bytes == 0


async def test_single_messages_with_nothing_in_flight_are_written_by_the_loop_itself(tmp_path: Path) -> None:
    """With no write in flight, a group of single messages is written and answered on the loop (no
    thread hop, no wait for the GIL); a batch goes to the writer thread, and single messages queued
    while it is in flight follow it there, so the WAL keeps hand-off order and offsets stay dense."""
    wal = Wal(tmp_path / "wal", segment_bytes=1 << 24, fsync=True)
    wal.recover()
    writers: list[tuple[int, list[Record | Chunk]]] = []
    append = wal.append
    in_flight = threading.Event()  # set by the test: the batch's write may finish

    def traced(frames: list[object], records: list[Record | Chunk], *, sync: bool = True) -> None:
        writers.append((threading.get_ident(), list(records)))
        if any(isinstance(r, Chunk) for r in records):
            in_flight.wait(30)
        append(frames, records, sync=sync)  # type: ignore[arg-type]

    wal.append = traced  # type: ignore[method-assign,assignment]
    committer = GroupCommitter(wal, {}, lambda records: None, IngestMetrics(CollectorRegistry()), max_group=GROUP)
    committer.disk.trusted_now()  # a disk that has proven fast (see the slow-disk test below)
    running = asyncio.create_task(committer.run())
    await eventually_async(lambda: committer._writer is not None and committer._writer.is_alive(), 10,
                           what="the writer thread up")
    loop_thread = threading.get_ident()
    answered: list[str] = []

    a, b = single(b"a"), single(b"b")
    a.then, b.then = (lambda: answered.append("a")), (lambda: answered.append("b"))
    committer.submit_one(a)
    committer.submit_one(b)
    await asyncio.sleep(0)  # one pass: the hand-off writes and answers both
    assert answered == ["a", "b"] and a.outcome == (0, 0, a.record.timestamp_us) and b.outcome is not None
    assert b.record.offset == 1
    assert writers == [(loop_thread, [a.record, b.record])]

    big = batch(10)  # under max_group: messages behind it are handed over while it is written
    big.future = asyncio.get_running_loop().create_future()
    committer.submit([big])
    c = single(b"c")
    c.future = asyncio.get_running_loop().create_future()
    await asyncio.sleep(0)  # the batch is handed to the thread, whose write waits for in_flight
    committer.submit_one(c)  # queued behind a write in flight: not inline
    await asyncio.sleep(0)
    assert c.outcome is None
    in_flight.set()
    await asyncio.wait_for(asyncio.gather(big.future, c.future), 30)
    assert [thread != loop_thread for thread, _ in writers[1:]] == [True] * (len(writers) - 1)
    assert [r for _, records in writers for r in records] == [a.record, b.record, big.chunk, c.record]
    assert big.chunk.offset == 2 and c.future.result()[1] == 12  # dense, in hand-off order

    committer.close()
    await running
    wal.close()


async def test_ack_none_messages_are_answered_before_their_write_and_share_the_next_one(tmp_path: Path) -> None:
    """Messages nobody waits for (ack=none) are answered at the end of the pass that queued them,
    before anything is written; behind a write in flight they are answered at once too, and wait
    for its report to be written together in the next write."""
    wal = Wal(tmp_path / "wal", segment_bytes=1 << 24, fsync=True)
    wal.recover()
    writes: list[list[Record | Chunk]] = []
    synced: list[bool] = []
    append = wal.append
    in_flight = threading.Event()
    answered: list[str] = []

    def traced(frames: list[object], records: list[Record | Chunk], *, sync: bool = True) -> None:
        writes.append(list(records))
        synced.append(sync)
        if any(isinstance(r, Chunk) for r in records):
            in_flight.wait(30)
        assert answered[:2] == ["a", "b"], "answered before the first write"
        append(frames, records, sync=sync)  # type: ignore[arg-type]

    wal.append = traced  # type: ignore[method-assign,assignment]
    committer = GroupCommitter(wal, {}, lambda records: None, IngestMetrics(CollectorRegistry()), max_group=GROUP)
    running = asyncio.create_task(committer.run())
    await eventually_async(lambda: committer._writer is not None and committer._writer.is_alive(), 10,
                           what="the writer thread up")

    def none(name: str) -> Pending:
        p = single(name.encode())
        p.then, p.early = (lambda: answered.append(name)), True
        return p

    a, b = none("a"), none("b")
    committer.submit_one(a)
    committer.submit_one(b)
    await asyncio.sleep(0)
    assert answered == ["a", "b"]
    await eventually_async(lambda: len(writes) == 1, 10, what="a and b written")
    assert writes == [[a.record, b.record]]

    big = batch(10)
    big.future = asyncio.get_running_loop().create_future()
    committer.submit([big])
    await eventually_async(lambda: len(writes) == 2, 10, what="the batch's write in flight")
    c, d = none("c"), none("d")
    committer.submit_one(c)
    await asyncio.sleep(0)
    committer.submit_one(d)
    await asyncio.sleep(0)
    assert answered == ["a", "b", "c", "d"], "answered though a write is in flight"
    await asyncio.sleep(0.05)
    assert len(writes) == 2, "not written while the batch's write is in flight"
    in_flight.set()
    await asyncio.wait_for(big.future, 30)
    await eventually_async(lambda: len(writes) == 3, 10, what="c and d written")
    assert writes[2] == [c.record, d.record], "one write for both"
    assert (c.record.offset, d.record.offset) == (12, 13)
    assert synced == [False, True, False], "only the awaited batch's write is fdatasynced"

    committer.close()
    await running
    wal.close()


async def test_the_loop_writes_only_while_the_disk_proves_fast_and_probes_it_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop writes a small group itself only while the disk has proven fast. With WAL writes
    that take 300 ms, a write on the loop's thread would stall /healthz, other topics and timers
    for that long on every produce. A single slow write among fast ones (the GIL held by another
    thread meanwhile, as on a busy host) keeps the trust; a stall loses it at once, and probes
    win it back once the disk is fast again, backing off while it is not. (Fast means 100 ms here
    and a stall 250 ms, so that the real fdatasyncs of a busy test host count as fast: at 50 ms,
    three slow ones in five lost the trust once beside a loaded suite.)"""
    from lakebroker.ingest_api import disk_trust
    from lakebroker.ingest_api.broker import Broker
    from lakebroker.ingest_api.messages import AckMode, NewMessage
    from lakebroker.tables.settings import Settings
    from lakebroker.tables.topics import new_topic

    monkeypatch.setattr(disk_trust, "INLINE_WRITE_S", 0.1)
    monkeypatch.setattr(disk_trust, "STALL_S", 0.25)
    monkeypatch.setattr(disk_trust, "PROBE_FIRST_S", 0.5)
    broker = Broker(Settings(data_dir=tmp_path / "data", wal_fsync=True), IngestMetrics(CollectorRegistry()))
    await broker.start()
    loop_thread = threading.current_thread()
    real_append = broker.wal.append
    delays: list[float] = [0.3]  # each write takes the first; a longer list is used up one write at a time
    on_loop: list[tuple[float, bool]] = []  # (delay, written on the loop's thread), per WAL write

    def append(frames: list[object], records: list[object], *, sync: bool = True) -> None:
        delay = delays.pop(0) if len(delays) > 1 else delays[0]
        on_loop.append((delay, threading.current_thread() is loop_thread))
        time.sleep(delay)
        real_append(frames, records, sync=sync)  # type: ignore[arg-type]

    broker.wal.append = append  # type: ignore[method-assign]

    async def produce(n: int) -> None:
        for i in range(n):
            await broker.local.produce("t", [NewMessage(value=b"m%d" % i)], AckMode.WAL)

    async def until_inline() -> None:
        for _ in range(100):  # 16 fast writes in a row, or a probe; a hiccup of the host restarts the count
            await produce(10)
            if on_loop[-1][1]:
                return
        raise AssertionError(f"a fast disk never got the inline path: {on_loop}")

    try:
        await broker.create_topic(new_topic("t", 1))
        await produce(5)
        assert not any(loop for _, loop in on_loop), "a disk slow from the start was written on the loop"

        delays[:] = [0.0]
        await until_inline()
        on_loop.clear()
        delays[:] = [0.15, 0.0]  # one slow write, not a stall
        await produce(10)
        assert all(loop for _, loop in on_loop), f"one slow write lost the trust: {on_loop}"

        on_loop.clear()
        delays[:] = [0.3]  # stalls from now on
        started = time.monotonic()
        while time.monotonic() - started < 2.0:
            await produce(1)
        written = [loop for _, loop in on_loop]
        # the first stall (0-0.3 s), a probe 0.5 s after it (0.8-1.1 s), the next 1 s after that (2.1 s)
        assert written[0] and 2 <= sum(written) <= 3, f"the loop stalled on a slow disk: {on_loop}"

        delays[:] = [0.0]
        await until_inline()  # a probe found the disk fast again
    finally:
        await broker.stop()
