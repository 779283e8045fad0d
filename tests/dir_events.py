"""inotify on one directory, for tests that must show how a file got its name (Linux only)."""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path


class DirEvents:
    """Which names were created or written in place in a directory, and which arrived by a rename.

    The kernel queues every event, so what it reports does not depend on timing."""

    IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x8, 0x80, 0x100

    def __init__(self, directory: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0 or libc.inotify_add_watch(self._fd, str(directory).encode(),
                                                  self.IN_CREATE | self.IN_MOVED_TO | self.IN_CLOSE_WRITE) < 0:
            raise OSError(ctypes.get_errno(), "inotify")
        self.created: list[str] = []
        self.renamed_in: list[str] = []
        self.written: list[str] = []  # closed after a write under this name: rewritten in place

    def drain(self) -> None:
        while True:
            try:
                buf = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            i = 0
            while i < len(buf):
                _wd, mask, _cookie, length = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + length].rstrip(b"\0").decode()
                if mask & self.IN_CLOSE_WRITE:
                    self.written.append(name)
                else:
                    (self.created if mask & self.IN_CREATE else self.renamed_in).append(name)
                i += 16 + length

    def close(self) -> None:
        os.close(self._fd)
