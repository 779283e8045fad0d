"""The idempotent-producer index: (topic id, message id) → the original partition, offset and timestamp.

An id is a producer-supplied message id, or a producer id with a sequence number. The index
is bounded by a time window and an entry count, and is rebuilt at start from the WAL and the
Delta table, so a retry after a restart still gets the original answer.

At the default of 2M ids a dict of tuples and strings would take about 0.8 GB, so a placed id
is kept as fixed-width numbers in arrays (44 bytes an id when full): a 128-bit hash of the key
and its placement, an open-addressing slot table over them, and a ring in insertion order that
eviction takes from.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from array import array
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DedupKey = tuple[str, str]  # (topic id, not name: a re-created topic is a new log; dedup id)
Placed = tuple[int, int, int]  # where a message went: partition, offset, log-append time (epoch µs)

_EMPTY = -1
_FIRST_CAPACITY = 1024
_WIDTH = 4  # int64s per id in `_entries`: hash, hash, offset, time; one cache line for a lookup to read
_HALVES = struct.Struct("<qq")
_blake2b = hashlib.blake2b


def dedup_id(message_id: str | None, producer_id: str | None, sequence: int | None) -> str | None:
    if message_id is not None:
        return "m:" + message_id
    if producer_id is not None and sequence is not None:
        return f"p:{producer_id}:{sequence}"
    return None


def dedup_ids(message_id: pa.Array | pa.ChunkedArray, producer_id: pa.Array | pa.ChunkedArray | None = None,
              sequence: pa.Array | pa.ChunkedArray | None = None) -> pa.Array | pa.ChunkedArray:
    """`dedup_id` over columns: null in a row that has none."""
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
    """Placed ids live at ring positions [tail, tail + count) modulo the capacity, oldest first;
    `_slots` maps a hash's home slot, by linear probing, to a ring position. Remembering an id
    again updates it in place: its age stays that of its first placement."""

    def __init__(self, *, window_s: float, max_entries: int) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._inflight: dict[DedupKey, asyncio.Future[Placed]] = {}  # few: only sends not yet durable
        # A new id is hashed once: lookup's miss hands its hash to begin, and remember takes it.
        self._missed: tuple[DedupKey | None, int, int] = (None, 0, 0)
        self._hashes: dict[DedupKey, tuple[int, int]] = {}
        self._position = "i" if max_entries < 2**31 else "q"  # a ring position, in the slot table
        self._count = 0
        self._tail = 0
        self._allocate(min(_FIRST_CAPACITY, max_entries))

    def __len__(self) -> int:
        return self._count

    def lookup(self, key: DedupKey) -> Placed | asyncio.Future[Placed] | None:
        h0, h1 = key_hash(key)
        slots, mask, entries = self._slots, self._mask, self._entries
        i = h0 & mask
        while (pos := slots[i]) != _EMPTY:
            at = pos * _WIDTH
            if entries[at] == h0 and entries[at + 1] == h1:
                return self._partition[pos], entries[at + 2], entries[at + 3]
            i = (i + 1) & mask
        self._missed = (key, h0, h1)
        return self._inflight.get(key)

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
        if (pos := self._find(h0, h1)) != _EMPTY:
            at = pos * _WIDTH
            self._partition[pos], self._entries[at + 2], self._entries[at + 3] = placed
            self._evict()
        else:
            self._insert(h0, h1, placed)

    def reserve(self, entries: int) -> None:
        """Room for this many ids at once, up to max_entries (the rebuild at start knows how many it
        brings): growing step by step would copy the arrays at each step and hold two at the last."""
        if min(entries, self.max_entries) > self._capacity:
            self._grow(min(entries, self.max_entries))

    # -- storage ------------------------------------------------------------------------
    def _allocate(self, capacity: int) -> None:
        """Empty arrays for `capacity` ids, and a slot table at most half full."""
        self._capacity = capacity
        self._entries = array("q", [0]) * (_WIDTH * capacity)  # repetition allocates exactly; append does not
        self._partition = array("i", [0]) * capacity
        size = 1 << (2 * capacity - 1).bit_length()
        self._slots = array(self._position, [_EMPTY]) * size
        self._mask = size - 1

    def _find(self, h0: int, h1: int) -> int:
        """The ring position of this hash, or _EMPTY."""
        slots, mask, entries = self._slots, self._mask, self._entries
        i = h0 & mask
        while (pos := slots[i]) != _EMPTY:
            at = pos * _WIDTH
            if entries[at] == h0 and entries[at + 1] == h1:
                return pos
            i = (i + 1) & mask
        return _EMPTY

    def _insert(self, h0: int, h1: int, placed: Placed) -> None:
        """Put a hash known to be absent at the ring's head, after making room there."""
        if self._count == self._capacity:
            if self._capacity < self.max_entries:
                self._grow()
            else:
                self._drop_oldest()
        slots, mask, entries = self._slots, self._mask, self._entries
        i = h0 & mask
        while slots[i] != _EMPTY:
            i = (i + 1) & mask
        pos = (self._tail + self._count) % self._capacity
        slots[i] = pos
        at = pos * _WIDTH
        entries[at], entries[at + 1] = h0, h1
        self._partition[pos], entries[at + 2], entries[at + 3] = placed
        self._count += 1
        self._evict()

    def _evict(self) -> None:
        horizon_us = (time.time() - self.window_s) * 1_000_000
        while self._count and self._entries[self._tail * _WIDTH + 3] < horizon_us:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        """Remove the ring's tail, and its slot by backward-shift deletion: each later entry of the
        probe run moves back into the gap unless that would put it before its home slot, so a
        lookup's probe never meets a hole (no tombstones)."""
        tail = self._tail
        slots, mask, entries = self._slots, self._mask, self._entries
        gap = entries[tail * _WIDTH] & mask
        while slots[gap] != tail:
            gap = (gap + 1) & mask
        j = gap
        while (pos := slots[j := (j + 1) & mask]) != _EMPTY:
            home = entries[pos * _WIDTH] & mask
            if (j - home) & mask >= (j - gap) & mask:  # its home is at or before the gap (cyclically)
                slots[gap] = pos
                gap = j
        slots[gap] = _EMPTY
        self._tail = (tail + 1) % self._capacity
        self._count -= 1

    def _grow(self, capacity: int = 0) -> None:
        """Enlarge the arrays to `capacity` ids, by default double (up to max_entries). The ring's
        entries are copied oldest first to the new arrays' start, and the slot table is built anew
        with numpy: a per-entry loop would hold the event loop for about a second at a million
        ids, this a tenth of that."""
        entries, partition, tail, count = self._entries, self._partition, self._tail, self._count
        first = min(count, self._capacity - tail)  # those from the tail to the arrays' end; then from the start
        self._allocate(capacity or min(2 * self._capacity, self.max_entries))
        self._entries[:_WIDTH * first] = entries[_WIDTH * tail:_WIDTH * (tail + first)]
        self._entries[_WIDTH * first:_WIDTH * count] = entries[:_WIDTH * (count - first)]
        self._partition[:first] = partition[tail:tail + first]
        self._partition[first:count] = partition[:count - first]
        self._tail = 0
        self._place_all(count)

    def _place_all(self, count: int) -> None:
        """Fill the empty slot table with ring positions 0..count-1. Sorted by home slot, linear
        probing puts the i-th entry at max(home_i, slot of entry i-1 + 1): a running maximum. The
        few whose run passes the table's end wrap around and are probed one by one."""
        mask = self._mask
        homes = np.frombuffer(self._entries, np.int64, _WIDTH * count)[::_WIDTH] & mask
        order = np.argsort(homes)  # any order within a home is a valid table
        rank = np.arange(count, dtype=np.int64)
        slot = np.maximum.accumulate(homes[order] - rank) + rank
        fits = slot <= mask
        np.frombuffer(self._slots, self._slots.typecode)[slot[fits]] = order[fits]
        slots = self._slots
        for pos in order[~fits].tolist():
            i = 0
            while slots[i] != _EMPTY:
                i = (i + 1) & mask
            slots[i] = pos
