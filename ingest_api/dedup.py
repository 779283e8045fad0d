"""The idempotent-producer index: (topic id, message id) → the original partition, offset and timestamp.

An id is a producer-supplied message id, or a producer id with a sequence number. The index
is bounded by a time window and an entry count, and is rebuilt at start from the WAL and the
Delta table, so a retry after a restart still gets the original answer.

A dict of tuples and strings would take hundreds of bytes an id, so a placed id is kept as
fixed-width numbers (`DedupIndex`): about 12 bytes an id in memory, and its 128-bit hash and
placement in a ring file beside the WAL (docs/decisions/0015-dedup-index-as-fixed-width-hashes.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import mmap
import os
import struct
import tempfile
import time
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal, TypeAlias, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DedupKey = tuple[str, str]  # (topic id, not name: a re-created topic is a new log; dedup id)
Placed = tuple[int, int, int]  # where a message went: partition, offset, log-append time (epoch µs)

_HALVES = struct.Struct("<qq")
_RECORD = struct.Struct("=5q")  # a ring file record: hash, hash, partition, offset, log-append time (µs)
_WIDTH = 5
_BLOCK = 1024  # records a ring file block holds; the head's and the tail's blocks are kept in memory
_BLOCK_BYTES = _BLOCK * _RECORD.size
_TAG_MASK = 0xFFFF_FFFF
# An offset below this marks an entry being stored again: -2 - (move << 32 | row in the move).
_MOVING = -2
_blake2b = hashlib.blake2b


Column: TypeAlias = pa.Array | pa.ChunkedArray


def dedup_id(message_id: str | None, producer_id: str | None, sequence: int | None, partition: int) -> str | None:
    """A message's identity in the dedup index: its id, else its producer's sequence in its partition
    (a producer's sequences run per partition, as Kafka's do: sequence 0 in two partitions is two
    messages)."""
    if message_id is not None:
        return "m:" + message_id
    if producer_id is not None and sequence is not None:
        return f"p:{producer_id}:{partition}:{sequence}"
    return None


def dedup_ids(message_id: Column, producer_id: Column | None = None, sequence: Column | None = None,
              partition: Column | int | None = None) -> Column:
    """`dedup_id` over columns (`partition`: a column, or one partition for every row): null in a
    row that has none."""
    by_message = pc.binary_join_element_wise("m", message_id, ":")
    if producer_id is None or sequence is None:
        return by_message
    assert partition is not None, "a producer's sequences are per partition"
    part = pa.scalar(str(partition)) if isinstance(partition, int) else pc.cast(partition, pa.string())
    by_producer = pc.binary_join_element_wise("p", producer_id, part, pc.cast(sequence, pa.string()), ":")
    return pc.if_else(pc.is_valid(message_id), by_message, by_producer)


def spread_id(message_id: str | None, producer_id: str | None, sequence: int | None) -> str | None:
    """What places a keyless message with an id on a partition (partitioner.py): its id, or its
    producer and sequence, so a retry lands where the first send did."""
    if message_id is not None:
        return "m:" + message_id
    if producer_id is not None and sequence is not None:
        return f"p:{producer_id}:{sequence}"
    return None


def spread_ids(message_id: Column, producer_id: Column | None = None, sequence: Column | None = None) -> Column:
    """`spread_id` over columns: null in a row that has none."""
    by_message = pc.binary_join_element_wise("m", message_id, ":")
    if producer_id is None or sequence is None:
        return by_message
    by_producer = pc.binary_join_element_wise("p", producer_id, pc.cast(sequence, pa.string()), ":")
    return pc.if_else(pc.is_valid(message_id), by_message, by_producer)


def key_hash(key: DedupKey) -> tuple[int, int]:
    """The key's 128-bit hash as two int64s. Only the hash is kept, so two keys with one hash
    would answer a new message as a duplicate of the other and lose it: at 128 bits the odds
    among even 2^32 ids are about 1 in 10^20. NUL never occurs in a hex topic id, so the two
    parts cannot run into each other; `surrogatepass`, since a str may hold a lone surrogate."""
    data = f"{key[0]}\x00{key[1]}".encode("utf-8", "surrogatepass")
    # The full digest's first 16 bytes: as good as blake2b(digest_size=16), and quicker to call.
    return _HALVES.unpack_from(_blake2b(data).digest())  # type: ignore[return-value]


def key_hashes(keys: Iterable[DedupKey]) -> np.ndarray:
    """`key_hash` of each key, as rows of an (n, 2) int64 array."""
    digests = b"".join(_blake2b(f"{t}\x00{i}".encode("utf-8", "surrogatepass")).digest()[:16] for t, i in keys)
    return np.frombuffer(digests, "<i8").reshape(-1, 2)


class DedupIndex:
    """Placed ids live at ring positions [tail, tail + count) modulo max_entries, oldest first.

    In memory, per id: its tag (the low 32 bits of the hash) at its ring position, and that
    position in an open-addressing slot table at most half full, whose home slot is a function of
    the tag, so an entry can be moved or deleted without its full hash (about 12 bytes an id).
    The full hash and the placement (40 bytes) are records in a ring file at the same position,
    read only when a tag matches: a retried send, about one in 4 billion others. The file's pages
    sit in the page cache, not in the process. The newest block of records is kept in memory and
    written as it fills; the oldest block is kept in memory while eviction walks it. The file is
    scratch: the index is rebuilt at every start, so the file is truncated at open.

    Remembering an id again updates it in place: its age stays that of its first placement."""

    def __init__(self, *, window_s: float, max_entries: int, directory: Path | None = None) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._inflight: dict[DedupKey, asyncio.Future[Placed]] = {}  # few: only sends not yet durable
        # Messages being stored again (`move`): the first one's placement, by move number, until durable.
        self._moves: dict[int, asyncio.Future[Placed]] = {}
        self._next_move = 0
        # A new id is hashed once: lookup's miss hands its hash to begin, and remember takes it.
        self._missed: tuple[DedupKey | None, int, int] = (None, 0, 0)
        self._hashes: dict[DedupKey, tuple[int, int]] = {}
        self._count = 0
        self._tail = 0
        # Zero-filled anonymous maps: their pages become resident only as ids reach them, so an
        # idle broker holds little, and nothing is ever copied to grow.
        self._size = max(8, 2 * max_entries)
        self._slots = _zeros(self._size, "I" if max_entries < 2**32 - 1 else "Q")  # ring position + 1; 0 empty
        self._tags = _zeros(max_entries, "I")
        # open for the index's life (close() ends it)
        if directory is None:
            self._file = tempfile.TemporaryFile(prefix="lakebroker-dedup-")  # noqa: SIM115
        else:
            directory.mkdir(parents=True, exist_ok=True)
            self._file = (directory / "dedup.ring").open("w+b")
        self._fd = self._file.fileno()
        os.ftruncate(self._fd, 0)
        os.ftruncate(self._fd, max_entries * _RECORD.size)
        self._head_block = 0
        self._head = array("q", bytes(_BLOCK_BYTES))  # the block the next id is written to
        self._tail_block = -1
        self._tail_records = array("q")  # the block eviction walks, when it is not the head's

    def close(self) -> None:
        self._file.close()

    def __len__(self) -> int:
        return self._count

    def lookup(self, key: DedupKey) -> Placed | asyncio.Future[Placed] | None:
        h0, h1 = key_hash(key)
        if (pos := self._find(h0, h1)) >= 0:
            placed = self._placed(pos)
            if placed[1] >= 0:
                return placed
            # Being stored again: its new placement once durable. (Not `_missed`: a send accepted
            # afresh after a failed move finds this entry again, and `remember` updates it in place.)
            return self._moving(placed) or self._inflight.get(key)
        self._missed = (key, h0, h1)
        return self._inflight.get(key)

    def move(self, hashes: list[tuple[int, int] | None], partition: int, first: asyncio.Future[Placed]) -> None:
        """Messages stored again at new offsets (a partition this node claimed back after another node
        committed to it), by the `key_hash` of each one's id (None: none): until `first`, the first
        one's new placement, is durable, a lookup of their ids waits for theirs rather than answer
        the offset they had before the move, which is another message's now."""
        move = self._next_move
        self._next_move = (move + 1) % (1 << 30)  # with a row number under 2**32, within an int64
        self._moves[move] = first
        first.add_done_callback(lambda _: self._moves.pop(move, None))
        now_us = time.time_ns() // 1000
        for row, hashed in enumerate(hashes):
            if hashed is None:
                continue
            moving = (partition, _MOVING - (move << 32 | row), now_us)
            if (pos := self._find(*hashed)) >= 0:
                self._write(pos, *hashed, moving[:2] + self._placed(pos)[2:])  # its age stays the first's
            else:
                self._insert(*hashed, moving)

    def begin(self, key: DedupKey, future: asyncio.Future[Placed]) -> None:
        self._inflight[key] = future
        missed, h0, h1 = self._missed
        if missed is key:
            self._hashes[key] = (h0, h1)
            self._missed = (None, 0, 0)

    def abandon(self, key: DedupKey) -> None:
        """The send failed before it was durable: a retry must be accepted afresh."""
        self._inflight.pop(key, None)
        self._hashes.pop(key, None)

    def remember(self, key: DedupKey, placed: Placed) -> None:
        """`placed`'s log-append time also dates the entry for the window."""
        self._inflight.pop(key, None)
        hashed = self._hashes.pop(key, None)
        if hashed is None:
            self.restore(*key_hash(key), placed)
            return
        # The hash begin took over is of an id that missed and has been in flight since: only this
        # remember can have placed it, so it is not looked for.
        self._insert(*hashed, placed)

    def restore(self, h0: int, h1: int, placed: Placed) -> None:
        """`remember` by the key's `key_hash`: the rebuild at start hashes its ids in bulk."""
        if (pos := self._find(h0, h1)) >= 0:
            self._write(pos, h0, h1, placed)
            self._evict()
        else:
            self._insert(h0, h1, placed)

    def _moving(self, placed: Placed) -> asyncio.Future[Placed] | None:
        """The new placement of a message being stored again, or None if that failed."""
        move, row = divmod(_MOVING - placed[1], 1 << 32)
        first = self._moves.get(move)
        if first is None:
            return None
        return derived(first, lambda p: (p[0], p[1] + row, p[2]))

    # -- the slot table -----------------------------------------------------------------
    def _home(self, tag: int) -> int:
        return tag * self._size >> 32

    def _find(self, h0: int, h1: int) -> int:
        """The ring position of this hash, or -1."""
        slots, tags, size = self._slots, self._tags, self._size
        tag = h0 & _TAG_MASK
        i = tag * size >> 32
        while pos := slots[i]:
            if tags[pos - 1] == tag and self._record(pos - 1)[:2] == (h0, h1):
                return pos - 1
            i = i + 1 if i + 1 < size else 0
        return -1

    def _insert(self, h0: int, h1: int, placed: Placed) -> None:
        """Put a hash known to be absent at the ring's head, after making room there."""
        if self._count == self.max_entries:
            self._drop_oldest()
        slots, size = self._slots, self._size
        tag = h0 & _TAG_MASK
        i = tag * size >> 32
        while slots[i]:
            i = i + 1 if i + 1 < size else 0
        pos = (self._tail + self._count) % self.max_entries
        slots[i] = pos + 1
        self._tags[pos] = tag
        self._write(pos, h0, h1, placed)
        self._count += 1
        self._evict()

    def _evict(self) -> None:
        horizon_us = (time.time() - self.window_s) * 1_000_000
        while self._count and self._record(self._tail)[4] < horizon_us:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        """Remove the ring's tail, and its slot by backward-shift deletion: each later entry of the
        probe run moves back into the gap unless that would put it before its home slot, so a
        lookup's probe never meets a hole (no tombstones)."""
        tail = self._tail
        slots, tags, size = self._slots, self._tags, self._size
        gap = tags[tail] * size >> 32
        while slots[gap] != tail + 1:
            gap = gap + 1 if gap + 1 < size else 0
        j = gap
        while True:
            j = j + 1 if j + 1 < size else 0
            if not (pos := slots[j]):
                break
            home = tags[pos - 1] * size >> 32
            if (j - home) % size >= (j - gap) % size:  # its home is at or before the gap (cyclically)
                slots[gap] = pos
                gap = j
        slots[gap] = 0
        self._tail = (tail + 1) % self.max_entries
        self._count -= 1

    # -- the ring file --------------------------------------------------------------------
    def _placed(self, pos: int) -> Placed:
        _, _, partition, offset, at_us = self._record(pos)
        return partition, offset, at_us

    def _record(self, pos: int) -> tuple[int, int, int, int, int]:
        """(h0, h1, partition, offset, time) at a ring position."""
        block, at = divmod(pos, _BLOCK)
        if block == self._head_block:
            records = self._head
        elif block == self._tail_block:
            records = self._tail_records
        elif pos == self._tail:  # eviction reached a new block: keep it while eviction walks it
            self._tail_block, self._tail_records = block, self._read_block(block)
            records = self._tail_records
        else:
            return _RECORD.unpack(os.pread(self._fd, _RECORD.size, pos * _RECORD.size))  # type: ignore[return-value]
        i = at * _WIDTH
        return records[i], records[i + 1], records[i + 2], records[i + 3], records[i + 4]

    def _write(self, pos: int, h0: int, h1: int, placed: Placed) -> None:
        block, at = divmod(pos, _BLOCK)
        if block != self._head_block and pos == (self._tail + self._count) % self.max_entries:
            # The head moves on to a new block: write the full one out, and read the new one
            # (older ids may still live in it, past the head)
            os.pwrite(self._fd, self._head.tobytes(), self._head_block * _BLOCK_BYTES)
            self._head_block, self._head = block, self._read_block(block)
            if block == self._tail_block:
                self._tail_block = -1
        if block == self._head_block:
            records = self._head
        else:
            os.pwrite(self._fd, _RECORD.pack(h0, h1, *placed), pos * _RECORD.size)
            if block != self._tail_block:
                return
            records = self._tail_records
        i = at * _WIDTH
        records[i], records[i + 1] = h0, h1
        records[i + 2], records[i + 3], records[i + 4] = placed

    def _read_block(self, block: int) -> array[int]:
        records = array("q")
        records.frombytes(os.pread(self._fd, _BLOCK_BYTES, block * _BLOCK_BYTES).ljust(_BLOCK_BYTES, b"\0"))
        return records


def _zeros(n: int, typecode: Literal["I", "Q"]) -> memoryview[int]:
    """n zeroed unsigned numbers (32 or 64 bits), in an anonymous map."""
    width = array(typecode).itemsize
    return memoryview(mmap.mmap(-1, max(n, 1) * width, flags=mmap.MAP_PRIVATE)).cast(typecode)


def remember_placed(dedup: DedupIndex, key: DedupKey) -> Callable[[asyncio.Future[Placed]], None]:
    """Once a message with an id is durable, the dedup index knows where; if it failed, forgets it."""

    def done(future: asyncio.Future[Placed]) -> None:
        if future.cancelled() or future.exception() is not None:
            dedup.abandon(key)
        else:
            dedup.remember(key, future.result())

    return done


T = TypeVar("T")


def derived(future: asyncio.Future[T], placement: Callable[[T], Placed]) -> asyncio.Future[Placed]:
    """A placement that follows `future`: `placement` of its result, or its failure."""
    out: asyncio.Future[Placed] = future.get_loop().create_future()

    def done(f: asyncio.Future[T]) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
        elif (exc := f.exception()) is not None:
            out.set_exception(exc)
        else:
            out.set_result(placement(f.result()))

    future.add_done_callback(done)
    return out
