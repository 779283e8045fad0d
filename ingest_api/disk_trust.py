"""Whether the event loop may write a small WAL group itself: the disk's record of fast writes.

"Proven fast" means INLINE_TRUST_WRITES writes of an inline group's size in a row took at most
INLINE_WRITE_S each. The trust is lost by a write that took over STALL_S, or by SLOW_OF_RECENT of
the loop's last RECENT writes over INLINE_WRITE_S. A write's time includes the wait for the GIL
after the fdatasync, which the flusher's thread may hold for a few ms: one slow write among fast
ones is that, not the disk. A write in the thread counts only when fast: behind a busy loop it
waits for the GIL twice. Once the trust is lost the groups go to the thread, and the loop tries one
write of its own again (a probe) after PROBE_FIRST_S, then after twice as long while probes stay
slow, up to PROBE_MAX_S; a fast probe restores the trust, which a busy loop's thread writes cannot.
So an fdatasync that takes 100 ms (a busy or failing disk, a network volume) stalls the loop once,
then at most once a minute, and a disk slow from the start never does: /healthz, other topics and
timers keep answering.
"""

from __future__ import annotations

import time
from collections import deque

INLINE_GROUP_BYTES = 256 * 1024  # a group the loop writes itself: about a millisecond of page-cache copy at most
INLINE_WRITE_S = 0.002  # a write of at most INLINE_GROUP_BYTES this fast (fdatasync included) counts as fast
INLINE_TRUST_WRITES = 16  # fast writes in a row before the loop writes a group itself
STALL_S = 0.05  # a write this slow loses the trust at once
RECENT, SLOW_OF_RECENT = 5, 3  # ... as do this many slow ones among the loop's last writes
PROBE_FIRST_S = 1.0  # once the trust is lost, the loop tries a write of its own this much later
PROBE_MAX_S = 64.0  # ... and twice as long after each slow probe, up to this


class DiskTrust:
    def __init__(self) -> None:
        self.fast_writes = 0  # writes of an inline group's size in a row that took at most INLINE_WRITE_S
        self._recent: deque[bool] = deque(maxlen=RECENT)  # the loop's last writes: slow or not
        self._proven = False  # trusted once: since then, probes try to win the trust back
        self._probe_at = 0.0  # monotonic time of the next probe while not trusted
        self._probe_wait = PROBE_FIRST_S

    def writes_inline(self) -> bool:
        """Whether the loop writes the next group itself: the disk is trusted, or a probe is due."""
        if self.fast_writes >= INLINE_TRUST_WRITES:
            return True
        return self._proven and time.monotonic() >= self._probe_at

    def trusted_now(self) -> None:
        """As if the disk had proven fast (tests of the inline path)."""
        self.fast_writes = INLINE_TRUST_WRITES

    def never(self) -> None:
        """No inline write until the disk proves fast again, and no probe before (tests of the thread)."""
        self.fast_writes = 0
        self._proven = False

    def judge(self, size: int, error: BaseException | None, took_s: float, inline: bool) -> None:
        """What one write says of the disk."""
        trusted = self.fast_writes >= INLINE_TRUST_WRITES
        if error is not None or took_s > STALL_S:
            if trusted or inline:  # lost now, or a failed probe: the next probe's time
                self._distrust(probe_failed=inline and not trusted)
            else:
                self.fast_writes = 0
            return
        if size > INLINE_GROUP_BYTES:  # larger writes say nothing of the inline size
            return
        slow = took_s > INLINE_WRITE_S
        if not inline:
            if not slow:
                self._trust_one()
            return
        if not trusted:  # a probe
            if slow:
                self._distrust(probe_failed=True)
            else:
                self.fast_writes = INLINE_TRUST_WRITES
                self._trust_one()
            return
        self._recent.append(slow)
        if sum(self._recent) >= SLOW_OF_RECENT:
            self._distrust(probe_failed=False)
        elif not slow:
            self._trust_one()

    def _trust_one(self) -> None:
        self.fast_writes += 1
        if self.fast_writes >= INLINE_TRUST_WRITES:
            self._proven = True
            self._probe_wait = PROBE_FIRST_S

    def _distrust(self, *, probe_failed: bool) -> None:
        if probe_failed:
            self._probe_wait = min(2 * self._probe_wait, PROBE_MAX_S)
        self.fast_writes = 0
        self._recent.clear()
        self._probe_at = time.monotonic() + self._probe_wait
