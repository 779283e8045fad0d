"""How far this process's clock is from the table storage's: leases are times, and every node
judges them by its own clock.

A node writes a small probe object under `_system/clocks/` and compares its own time at the write
with the modification time the storage gives the object: the file system's clock on local storage,
the object store's on S3 (whole seconds there, so a few probes narrow it down). The storage is the
one clock every node shares.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pyarrow.fs as pafs

from lakebroker.tables import storage


def max_skew_s(lease_ttl_s: float) -> float:
    """The skew the leases tolerate. A lease is renewed at half its life, so a node whose clock runs
    behind by S looks expired to the others S before it renews: a quarter of the TTL, with heartbeats
    more frequent than that, leaves another quarter for the heartbeat and its commit."""
    return lease_ttl_s / 4


@dataclass(frozen=True)
class Skew:
    """How far this clock is ahead of the storage's (negative: behind), as the bounds one probe
    allows: the write happened somewhere between the two readings of this clock, and a busy
    machine can stretch that interval by seconds."""

    low: float
    high: float

    @property
    def seconds(self) -> float:
        return (self.low + self.high) / 2

    def beyond(self, bound_s: float) -> bool:
        """Whether the clock is surely further off than `bound_s`, whichever instant the write took."""
        return self.low > bound_s or self.high < -bound_s


# On an object store, probes at several phases of its whole second: each brackets the skew within a
# second and the write's time, and the skew is one constant, so their intersection is as narrow as
# the phases are fine. Spaced by a non-divisor of the second, they cover its phases evenly.
STORE_PROBES = 8
STORE_PROBE_SPACING_S = 0.13
STORE_PRECISION_S = 0.25  # enough: no more probes once the bracket is this narrow


def skew(system_root: str, node: str) -> Skew:
    """This clock against the storage's, from one small write (a few on an object store). Blocking I/O."""
    fs, root = storage.filesystem(storage.join(system_root, "clocks"))
    assert isinstance(fs, pafs.FileSystem)
    path = f"{root}/{node}"
    if isinstance(fs, pafs.LocalFileSystem):  # an object store needs no folders
        fs.create_dir(root, recursive=True)
        before, after = _write(fs, path)
        # The kernel's own record, read by Python's stat: an LD_PRELOAD clock (libfaketime) also
        # shifts the times pyarrow's stat reads, and would hide the very skew looked for.
        stored = os.stat(path).st_mtime
        return Skew(before - stored, after - stored)
    low, high = -float("inf"), float("inf")
    last = Skew(low, high)
    for attempt in range(STORE_PROBES):
        if attempt:
            time.sleep(STORE_PROBE_SPACING_S)
        before, after = _write(fs, path)
        mtime = fs.get_file_info(path).mtime
        assert mtime is not None, f"{path}: the storage gives no modification time"
        stored = mtime.timestamp()  # whole seconds (Last-Modified): the write was within the second after
        last = Skew(before - stored - 1, after - stored)
        low, high = max(low, last.low), min(high, last.high)
        if low > high:  # a clock stepped between probes: only the newest one holds
            return last
        if high - low <= STORE_PRECISION_S:
            break
    return Skew(low, high)


def _write(fs: pafs.FileSystem, path: str) -> tuple[float, float]:
    """This clock just before and just after a write of the probe object."""
    before = time.time()
    with fs.open_output_stream(path) as out:
        out.write(str(before).encode())
    return before, time.time()
