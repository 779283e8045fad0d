"""The data-dir lock: one broker process owns a data dir's WAL and assigns its offsets.

Offsets are dense only if a single process assigns them, so `serve` and the embedded CLI
take this lock; a CLI command that finds it held talks to the running server instead.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from lakebroker.tables.errors import LakebrokerError


class DataDirBusy(LakebrokerError):
    code = "data_dir_busy"


class DataDirLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def holder(self) -> str:
        """Who holds it, for an error a person can act on: the pid the holder wrote, if any."""
        try:
            pid = self.path.read_text().strip()
        except OSError:
            pid = ""
        return f"pid {pid}" if pid.isdigit() else "another process"

    def acquire(self, data_dir: Path) -> None:
        """Take the lock, or raise DataDirBusy naming the process that holds it."""
        if not self.try_acquire():
            raise DataDirBusy(f"another lakebroker process ({self.holder()}) serves the data dir {data_dir}: "
                              "stop it, or give this process its own --data-dir")

    def refuse_if_held(self, data_dir: Path) -> None:
        """Raise DataDirBusy now, before a server binds its port, if another process holds the lock."""
        self.acquire(data_dir)
        self.release()
