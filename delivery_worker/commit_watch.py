"""Tells delivery pipelines of a new commit to their topic table as it lands, so a flush is
delivered within milliseconds instead of up to a poll interval later.

Where the table is a local directory and the OS has inotify (Linux), a worker keeps one watch
per followed table on its `_delta_log` directory: a commit is a new `<version>.json` there,
which both writers put in place whole (delta-rs by rename, Spark's LogStore by hard link).
Elsewhere (tables on object storage, another OS, or a directory the kernel will not watch, such
as past the per-user watch limit) `follow` returns None. The pipelines go on polling every
`delivery_poll_ms` either way: a watch on a shared filesystem (NFS) does not report another
machine's writes, and an overflowed event queue drops events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:  # imported at run time only where inotify exists
    from asyncinotify import Inotify, Watch

log = logging.getLogger(__name__)
COMMIT_FILE = re.compile(r"\d{20}\.json")
Callback = Callable[[], None]


def local_log_dir(table_uri: str) -> Path | None:
    """The table's `_delta_log` directory if the table is on the local filesystem."""
    parts = urlsplit(table_uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path)) / "_delta_log"
    if parts.scheme and len(parts.scheme) > 1:  # s3:// and the like (a one-letter scheme is a drive)
        return None
    return Path(table_uri) / "_delta_log"


@dataclass(eq=False)
class Following:
    """One pipeline's interest in one table; `active` turns False if the watch ends (the table
    was deleted), and the pipeline then asks again."""

    watch: CommitWatch
    log_dir: Path
    callback: Callback
    active: bool = True

    def close(self) -> None:
        self.watch.forget(self)


class CommitWatch:
    def __init__(self) -> None:
        self._inotify: Inotify | None = None
        self._reader: asyncio.Task[None] | None = None
        self._watches: dict[Path, Watch] = {}
        self._following: dict[Path, set[Following]] = {}
        self._unavailable = not sys.platform.startswith("linux")

    def follow(self, table_uri: str, callback: Callback) -> Following | None:
        """Call `callback` (on the event loop) after each new commit of the table; None if its
        commits cannot be watched from here (then the pipeline relies on polling)."""
        log_dir = local_log_dir(table_uri)
        if self._unavailable or log_dir is None or not log_dir.is_dir():
            return None
        try:
            if log_dir not in self._watches:
                self._watches[log_dir] = self._add_watch(log_dir)
        except OSError as exc:  # ENOSPC: the inotify watch limit; the table may also have just gone
            log.warning("cannot watch %s for commits (%s); polling it", log_dir, exc)
            return None
        following = Following(self, log_dir, callback)
        self._following.setdefault(log_dir, set()).add(following)
        return following

    def forget(self, following: Following) -> None:
        followers = self._following.get(following.log_dir)
        if followers is None:
            return
        followers.discard(following)
        if not followers:
            del self._following[following.log_dir]
            watch = self._watches.pop(following.log_dir, None)
            if watch is not None and self._inotify is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._inotify.rm_watch(watch)

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._inotify is not None:
            self._inotify.close()
        self._inotify = self._reader = None
        self._watches.clear()
        self._following.clear()

    # -- inotify --------------------------------------------------------------------------
    def _add_watch(self, log_dir: Path) -> Watch:
        from asyncinotify import Inotify, Mask

        if self._inotify is None:
            self._inotify = Inotify()
            self._reader = asyncio.create_task(self._read(), name="commit-watch")
        return self._inotify.add_watch(log_dir, Mask.CREATE | Mask.MOVED_TO | Mask.ONLYDIR)

    async def _read(self) -> None:
        from asyncinotify import Mask

        assert self._inotify is not None
        async for event in self._inotify:
            watch = event.watch
            if Mask.Q_OVERFLOW in event.mask or watch is None:  # events were dropped: everyone looks
                for followers in list(self._following.values()):
                    self._notify(followers)
                continue
            log_dir = Path(watch.path)
            followers = self._following.get(log_dir, set())
            if Mask.IGNORED in event.mask:  # the directory is gone (the topic was deleted)
                self._watches.pop(log_dir, None)
                self._following.pop(log_dir, None)
                for following in followers:
                    following.active = False
                self._notify(followers)
            elif event.name is not None and COMMIT_FILE.fullmatch(event.name.name):
                self._notify(followers)

    @staticmethod
    def _notify(followers: set[Following]) -> None:
        for following in list(followers):
            try:
                following.callback()
            except Exception:  # one pipeline's bug must not stop the others' notifications
                log.exception("commit callback failed")
