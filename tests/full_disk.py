"""Filling a small test disk to the last byte."""

from __future__ import annotations

from pathlib import Path


def fill(path: Path) -> None:
    """Write zeros to ``path`` until the disk is full.

    Unbuffered, so nothing is left in a buffer for ``close()`` to fail on.
    """
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
