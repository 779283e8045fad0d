"""Resident memory of a server process and its children, sampled in a background thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path


def status_mb(pid: int | str, field: str) -> float | None:
    """A memory line of /proc/<pid>/status (`pid` may be "self") in MB; None once the process is gone."""
    prefix = field + ":"
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(prefix):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def rss_mb(pid: int) -> float | None:
    return status_mb(pid, "VmRSS")


def peak_rss_mb(pid: int) -> float | None:
    """The kernel's high-water mark of the process's resident set (VmHWM): its peak over its whole
    life so far, with no sample to miss it."""
    return status_mb(pid, "VmHWM")


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out.extend(int(c) for c in (task / "children").read_text().split())
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


@dataclass
class RssSampler:
    """Peak RSS of `pid` and, summed, of its child processes (serve's delivery process, and any
    Spark job the scheduler starts), every `interval_s` until stopped."""

    pid: int
    interval_s: float = 0.25
    peak_mb: float = 0.0
    peak_children_mb: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            own = rss_mb(self.pid)
            if own is not None:
                self.peak_mb = max(self.peak_mb, own)
            kids = sum(r for r in (rss_mb(c) for c in children(self.pid)) if r is not None)
            self.peak_children_mb = max(self.peak_children_mb, kids)
