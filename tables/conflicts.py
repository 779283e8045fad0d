"""Optimistic concurrency's retry: a commit that lost to another writer's is planned again on a
fresh snapshot, after a random pause that grows with each loss, so racing writers spread out."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from deltalake.exceptions import CommitFailedError

from lakebroker.tables.errors import StorageUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


def retry_conflicts(work: Callable[[], T], *, what: str, attempts: int, pause_s: float,
                    conflicts: tuple[type[BaseException], ...] = (CommitFailedError,), warn: bool = False) -> T:
    """`work()` again after each conflict (one of `conflicts`), up to `attempts` runs; the pause
    before run n is random in [0, pause_s * n). StorageUnavailable once every run lost. `warn`
    logs each loss (the Spark jobs, whose runs take seconds; a state table's take milliseconds)."""
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except conflicts as exc:
            if attempt == attempts:
                raise StorageUnavailable(f"{what}: {attempts} concurrent commits won in a row") from exc
            if warn:
                log.warning("%s: concurrent commit (%s); planning again (attempt %d/%d)", what,
                            str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__, attempt + 1, attempts)
            time.sleep(random.uniform(0, pause_s * attempt))
    raise AssertionError("unreachable")
