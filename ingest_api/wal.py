"""The segmented, checksummed write-ahead log.

Appends go to the active segment as whole groups (one write and one fdatasync per group, see
group_commit.py). Each group lands in space zeroed ahead of it, as PostgreSQL pre-zeroes its WAL
segments: an fdatasync that need not also record a new file size is several times faster, and a
single produce at ack=wal waits for one (docs/decisions/0014-wal-room-zeroed-ahead-of-writes.md).

A segment is rolled once it passes `segment_bytes`: the next one is opened before the current
one is sealed, so a roll that fails (EMFILE, ENOSPC) leaves the group that was just written
durable and the current segment active. A segment is deleted only once every
record in it is committed to Delta.

A frame holds one record (records.py) or one columnar chunk of a batch (chunks.py); recovery
reads both, so a WAL written before chunks existed stays readable. Each write (one group, or
several handed over together) starts with a group frame that holds the byte length of the frames
after it: recovery tells by it whether a bad frame is followed by a later write.

Recovery reads every segment in order, to its last frame (zeros after it are unused room), and
hands back what it read in log order, which is offset order within each partition:
- a bad frame in the newest segment's last write is a torn write from a crash: that write's
  fdatasync never returned, so nothing from the bad frame on was acknowledged, and the segment is
  truncated there. Pages of one write can reach the disk in any order, so valid frames after the
  bad one do not make it corruption. A later write's fdatasync covers every earlier page, so a
  bad frame followed by another write's group frame is not torn;
- writes nobody waits for (ack=none groups) are not synced. After a power loss any of their pages
  may be missing while later ones survive, so only a group frame that follows a synced write (its
  magic says so; one that follows an unsynced write has another) proves the pages before it
  durable. A bad frame that no such group frame follows is a torn tail: the log ends there, and the
  writes after it, unsynced or never acknowledged, are dropped with it. Before a segment is sealed
  its last write is synced, so the rule for sealed segments is unchanged;
- any other bad frame is corruption: it is reported, the segment is copied to
  `wal/quarantine/`, the bad bytes are skipped and never replayed, and reading resumes at
  the next valid frame. (A segment written before group frames existed is read by the older
  rule: a bad frame in the newest segment is torn only when no valid frame follows it.)
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lakebroker.ingest_api.chunks import Chunk, ChunkFrameError, decode_chunk
from lakebroker.ingest_api.records import (
    CHUNK_MAGIC,
    FRAME_HEADER,
    FRAME_MAGIC,
    GROUP_MAGIC,
    MAGICS,
    MAX_FRAME_BYTES,
    UNSYNCED_GROUP_MAGIC,
    Record,
    decode,
    frame_crc_ok,
    seal,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = logging.getLogger(__name__)

_SUFFIX = ".wal"
ZERO_AHEAD = 4 * 1024 * 1024  # room zeroed (and made durable) ahead of the write position, at a time
_ZEROS = bytes(ZERO_AHEAD)
# A group this large is written past the zeroed room as it is: the file-size change its fdatasync
# then carries is a small share of its cost, while zeroing first would write its bytes twice
# (docs/decisions/0014-wal-room-zeroed-ahead-of-writes.md).
PLAIN_WRITE_BYTES = 256 * 1024
_GROUP = struct.Struct("<Q")  # a group frame's body: the byte length of the write's frames after it
GROUP_HEAD_BYTES = FRAME_HEADER.size + _GROUP.size  # what each write adds ahead of its frames

PartitionKey = tuple[bytes, int]  # (topic_id, partition)


@dataclass
class CorruptSpan:
    segment: str
    start: int
    end: int


@dataclass
class SegmentSummary:
    segment: str
    size: int
    records: int  # single-message records and the messages in batch chunks
    chunks: int


@dataclass
class RecoveryReport:
    items: list[Record | Chunk] = field(default_factory=list)  # in log order: offset order per partition
    torn_bytes: int = 0
    corrupt: list[CorruptSpan] = field(default_factory=list)
    segments: list[SegmentSummary] = field(default_factory=list)

    @property
    def records(self) -> list[Record]:
        return [r for r in self.items if isinstance(r, Record)]

    @property
    def chunks(self) -> list[Chunk]:  # a columnar batch's frames (chunks.py)
        return [c for c in self.items if isinstance(c, Chunk)]


@dataclass
class _Segment:
    path: Path
    max_offsets: dict[PartitionKey, int] = field(default_factory=dict)

    def note(self, written: Iterable[Record | Chunk]) -> None:
        for r in written:
            key = (r.topic_id, r.partition)
            last = r.end - 1 if isinstance(r, Chunk) else r.offset
            if last > self.max_offsets.get(key, -1):
                self.max_offsets[key] = last


def _rows(item: Record | Chunk) -> int:
    return item.rows if isinstance(item, Chunk) else 1


def group_head(size: int, *, after_synced: bool = True) -> bytes:
    """The group frame that starts a write of `size` bytes of frames (`after_synced`: the write before
    it was synced, which this frame's presence on disk then proves)."""
    return seal(GROUP_MAGIC if after_synced else UNSYNCED_GROUP_MAGIC, _GROUP.pack(size))


def _frame_at(data: bytes, pos: int) -> int | None:
    """End position of a valid frame starting at pos, or None."""
    if len(data) - pos < FRAME_HEADER.size:
        return None
    magic, length, crc = FRAME_HEADER.unpack_from(data, pos)
    end: int = pos + FRAME_HEADER.size + length
    if magic not in MAGICS or length > MAX_FRAME_BYTES or end > len(data):
        return None
    if not frame_crc_ok(length, crc, data[pos + FRAME_HEADER.size : end]):
        return None
    return end


def _next_valid_frame(data: bytes, pos: int, magics: tuple[bytes, ...] = MAGICS) -> int | None:
    # Only positions holding the magic are checksummed: a payload of random bytes holds it
    # about once per 4 GiB, so a resync costs a search, not a checksum per byte.
    candidate = _find_magic(data, pos, magics)
    while candidate >= 0:
        if _frame_at(data, candidate) is not None:
            return candidate
        candidate = _find_magic(data, candidate + 1, magics)
    return None


def _find_magic(data: bytes, pos: int, magics: tuple[bytes, ...]) -> int:
    found = [at for at in (data.find(magic, pos) for magic in magics) if at >= 0]
    return min(found) if found else -1


class Wal:
    def __init__(self, directory: Path, *, segment_bytes: int, fsync: bool) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock = threading.Lock()  # held by a group's write and fdatasync
        # The sealed list has its own lock: release() runs on the event loop, which must not wait
        # behind an fdatasync for it.
        self._sealed_lock = threading.Lock()
        self._sealed: list[_Segment] = []
        self._active: _Segment | None = None
        self._fd = -1
        self._size = 0  # where the next group is written
        self._zeroed = 0  # the active segment's bytes up to here exist (zeros past _size)
        self._synced = True  # the last write was synced (an fdatasync since covers it too)

    # -- recovery -----------------------------------------------------------------------
    def recover(self) -> RecoveryReport:
        """Read every segment, repair the tail, and open a fresh active segment."""
        self.directory.mkdir(parents=True, exist_ok=True)
        report = RecoveryReport()
        paths = sorted(self.directory.glob(f"*{_SUFFIX}"))
        for i, path in enumerate(paths):
            segment = _Segment(path)
            items = self._read_segment(path, newest=i == len(paths) - 1, report=report)
            segment.note(items)
            report.items.extend(items)
            self._sealed.append(segment)
        self._roll(int(paths[-1].stem) + 1 if paths else 1)
        return report

    def inspect(self) -> RecoveryReport:
        """What recovery would read, without changing anything: no truncation, no quarantine.
        A server may be appending meanwhile: its newest write may then read as torn."""
        report = RecoveryReport()
        paths = sorted(self.directory.glob(f"*{_SUFFIX}"))
        for i, path in enumerate(paths):
            report.items.extend(self._read_segment(path, newest=i == len(paths) - 1, report=report, repair=False))
        return report

    def _read_segment(self, path: Path, *, newest: bool, report: RecoveryReport,
                      repair: bool = True) -> list[Record | Chunk]:
        data = path.read_bytes()
        items: list[Record | Chunk] = []
        grouped = data[: len(FRAME_MAGIC)] not in (FRAME_MAGIC, CHUNK_MAGIC)  # else written before group frames
        pos = 0
        while pos < len(data):
            end = _frame_at(data, pos)
            if end is not None:
                magic = data[pos : pos + len(FRAME_MAGIC)]
                body = data[pos + FRAME_HEADER.size : end]
                if magic == FRAME_MAGIC:
                    items.append(decode(body))
                elif magic == CHUNK_MAGIC:
                    try:
                        items.append(decode_chunk(body))
                    except ChunkFrameError as exc:  # its checksum holds, its contents do not: never replay it
                        if repair:
                            self._quarantine(path)
                            log.error("WAL %s: bytes %d-%d: %s; not replayed", path.name, pos, end, exc)
                        report.corrupt.append(CorruptSpan(path.name, pos, end))
                pos = end
                continue
            if data.count(0, pos) == len(data) - pos:
                break  # the zeroed room ahead of the last group: never written
            resume = _next_valid_frame(data, pos + 1)
            later_write = _next_valid_frame(data, pos + 1, (GROUP_MAGIC,)) if grouped else resume
            if newest and later_write is None:
                torn = len(data[pos:].rstrip(b"\0"))  # what was written of it, not the zeroed room
                report.torn_bytes += torn
                if repair:
                    log.warning("WAL %s: truncating a torn last write: %d bytes at %d", path.name, torn, pos)
                    with path.open("r+b") as f:
                        f.truncate(pos)
                        os.fsync(f.fileno())
                break
            stop = pos + len(data[pos:].rstrip(b"\0")) if resume is None else resume  # not the zeroed room
            if repair:
                self._quarantine(path)
                log.error("WAL %s: corrupt bytes %d-%d fail their checksum; not replayed", path.name, pos, stop)
            report.corrupt.append(CorruptSpan(path.name, pos, stop))
            pos = stop
        report.segments.append(SegmentSummary(path.name, len(data), sum(_rows(i) for i in items),
                                              sum(isinstance(i, Chunk) for i in items)))
        return items

    def _quarantine(self, path: Path) -> None:
        target = self.directory / "quarantine" / path.name
        if not target.exists():
            target.parent.mkdir(exist_ok=True)
            shutil.copy2(path, target)

    # -- appending ----------------------------------------------------------------------
    def append(self, frames: list[Buffer], records: Iterable[Record | Chunk], *, sync: bool = True) -> None:
        """Write one group and, with `sync`, make it durable; on failure the segment is cut back to
        before it. `frames` are the group's frames, or pieces of them, in order. Without `sync` (a
        group nobody waits for) the write reaches the page cache only, which outlives the process
        but not the machine, until a later synced write covers it."""
        data = _coalesced(frames)
        size = sum(len(piece) for piece in data)
        with self._lock:
            assert self._active is not None, "recover() first"
            before = self._size
            try:
                if self.fsync and size < PLAIN_WRITE_BYTES:
                    self._zero_ahead(before + size + GROUP_HEAD_BYTES)
                head = memoryview(group_head(size, after_synced=self._synced))
                _write_all(self._fd, [head, *data], before)
                if self.fsync and (sync or before + size + len(head) >= self.segment_bytes):
                    os.fdatasync(self._fd)  # (always before a roll: a sealed segment is durable whole)
                    self._synced = True
                else:
                    self._synced = not self.fsync
            except OSError:
                self._cut_back(before)
                raise
            self._size = before + size + len(head)
            self._active.note(records)
            if self._size >= self.segment_bytes:
                # The group is durable whatever happens here: a failed roll must not fail it.
                try:
                    self._roll(int(self._active.path.stem) + 1)
                except OSError:
                    log.exception("WAL: could not roll to a new segment; %s grows until a roll succeeds",
                                  self._active.path.name)

    def _zero_ahead(self, end: int) -> None:
        """Make sure bytes up to `end` exist, zeroed and durable, so the group's own fdatasync
        carries data only. Where there is no room for that, the group is written plainly."""
        if end <= self._zeroed:
            return
        start = max(self._zeroed, self._size)
        target = end + ZERO_AHEAD
        try:
            pos = start
            while pos < target:
                pos += os.pwrite(self._fd, _ZEROS[: min(ZERO_AHEAD, target - pos)], pos)
            os.fdatasync(self._fd)
            self._synced = True  # it covers every earlier write too
        except OSError:  # a nearly full disk: give the room back; the plain write may still fit
            os.ftruncate(self._fd, self._size)
            self._zeroed = self._size
            return
        self._zeroed = target

    def _cut_back(self, size: int) -> None:
        try:
            os.ftruncate(self._fd, size)
            self._zeroed = size
        except OSError:
            log.exception("WAL: could not cut back a failed write; recovery will truncate it")

    def _roll(self, number: int) -> None:
        """Open segment `number` and make it active; on failure the current segment stays active."""
        path = self.directory / f"{number:016d}{_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the new file's name must survive a crash too
            finally:
                os.close(dir_fd)
        except OSError:
            os.close(fd)
            # An empty file left as the newest segment would make recovery treat a torn tail
            # in the segment before it as corruption.
            path.unlink(missing_ok=True)
            raise
        if self._active is not None:
            with self._sealed_lock:
                self._sealed.append(self._active)
            os.close(self._fd)
        self._fd, self._size, self._zeroed, self._active = fd, size, size, _Segment(path)

    def seal_if_holding(self, key: PartitionKey) -> None:
        """Seal the active segment if it holds records of `key`, so that `release` can delete them
        without waiting for the segment to fill: records handed to another node must leave soon."""
        with self._lock:
            if self._active is None or key not in self._active.max_offsets:
                return
            try:
                if self.fsync and not self._synced:
                    os.fdatasync(self._fd)  # a sealed segment is durable whole
                    self._synced = True
                self._roll(int(self._active.path.stem) + 1)
            except OSError:
                log.exception("WAL: could not seal %s; what it holds of messages handed to another node stays "
                              "until it fills", self._active.path.name)

    # -- release ------------------------------------------------------------------------
    def release(self, committed_below: Callable[[PartitionKey], int]) -> list[Path]:
        """Take out the sealed segments whose every record is below its partition's committed
        log-end, and return their files for `delete_segments`: deleting a full segment takes the
        kernel milliseconds, which a caller on the event loop spends in a thread. A file a crash
        leaves undeleted is read at the next start, and its records skipped as committed."""
        with self._sealed_lock:
            keep: list[_Segment] = []
            released: list[Path] = []
            for segment in self._sealed:
                if all(offset < committed_below(key) for key, offset in segment.max_offsets.items()):
                    released.append(segment.path)
                else:
                    keep.append(segment)
            self._sealed = keep
            return released

    def segment_count(self) -> int:
        with self._sealed_lock:
            return len(self._sealed) + (1 if self._active else 0)

    def close(self, committed_below: Callable[[PartitionKey], int] | None = None) -> None:
        """Close the active segment. Given `committed_below` (a clean stop, with everything
        flushed), first delete what is committed, and empty the active segment too when it is the
        only one left and all of it is committed: the next start then reads nothing it would
        only skip. (It stays, empty, so segment numbers keep growing.)"""
        if committed_below is not None:
            delete_segments(self.release(committed_below))
        with self._lock:
            if self._fd < 0:
                return
            active = self._active
            with self._sealed_lock:
                alone = not self._sealed
            if committed_below is not None and active is not None and alone and all(
                    offset < committed_below(key) for key, offset in active.max_offsets.items()):
                os.ftruncate(self._fd, 0)
                if self.fsync:
                    os.fsync(self._fd)
            elif self.fsync and not self._synced:  # a clean stop leaves nothing unsynced behind
                os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1


def delete_segments(paths: Iterable[Path]) -> None:
    """Delete released segment files (Wal.release)."""
    for path in paths:
        path.unlink(missing_ok=True)


_IOV_MAX = 1024  # Linux's limit on the pieces of one pwritev
_SMALL = 64 * 1024


def _coalesced(frames: list[Buffer]) -> list[memoryview]:
    """The pieces to write: small ones (single-message frames, frame heads) joined, large ones
    (Arrow IPC streams) as they are, so a group never becomes one bytes object under the GIL."""
    out: list[memoryview] = []
    small: list[Buffer] = []
    for frame in frames:
        view = memoryview(frame)
        if view.nbytes < _SMALL:
            small.append(frame)
            continue
        if small:
            out.append(memoryview(b"".join(small)))
            small = []
        out.append(view.cast("B"))
    if small:
        out.append(memoryview(b"".join(small)))
    return out


def _write_all(fd: int, pieces: list[memoryview], at: int) -> None:
    """pwritev until every piece is written (a write may stop short, as pwrite may)."""
    pending = list(pieces)
    while pending:
        written = os.pwritev(fd, pending[:_IOV_MAX], at)
        at += written
        while pending and written >= len(pending[0]):
            written -= len(pending.pop(0))
        if written:
            pending[0] = pending[0][written:]
