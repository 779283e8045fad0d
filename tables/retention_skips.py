"""Retention skips: the `_system/retention_skips` table.

When retention removes messages a consumer group has not delivered yet, the retention job
(spark_pipeline/jobs/retention.py) moves the group up to the new log start. It records each move
here first, one row per group and partition, and then commits the new offset with reason
`OffsetReason.RETENTION_SKIP`; a run that crashed in between records the same skip again, and
`retention_skips` returns it once.

Written and read with delta-rs only, so the API (a subscription's status), the dashboard and
Prometheus (spark_pipeline/metrics.py) read it without a JVM.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import GroupPartition
from lakebroker.tables.schemas import RETENTION_SKIPS_SCHEMA, RETENTION_SKIPS_SCHEMA_VERSION


@dataclass(frozen=True)
class RetentionSkip:
    group: str
    topic: str
    partition: int
    from_offset: int  # the group's committed offset before the skip
    to_offset: int  # the log start it was moved to
    skipped_at: datetime
    run_id: str

    @property
    def skipped_messages(self) -> int:
        return self.to_offset - self.from_offset


@dataclass(frozen=True)
class SkipSummary:
    """The skips of one group on one partition: how many, how many messages, and the latest."""

    skips: int
    messages: int
    last: RetentionSkip


def record_skips(layout: Layout, skips: list[RetentionSkip]) -> None:
    if not skips:
        return
    table = delta.ensure_table(layout.retention_skips_table, RETENTION_SKIPS_SCHEMA, partition_by=None,
                               version=RETENTION_SKIPS_SCHEMA_VERSION)
    rows = [{"group": s.group, "topic": s.topic, "partition": s.partition, "from_offset": s.from_offset,
             "to_offset": s.to_offset, "skipped_messages": s.skipped_messages, "skipped_at": s.skipped_at,
             "run_id": s.run_id} for s in skips]
    delta.append(table, pa.Table.from_pylist(rows, schema=RETENTION_SKIPS_SCHEMA),
                 metadata={"lakebroker.operation": "retention-skip"})


def retention_skips(layout: Layout, *, group: str | None = None, topic: str | None = None,
                    since: datetime | None = None) -> list[RetentionSkip]:
    """Every recorded skip (oldest first), for a subscription's status or the dashboard.

    A skip recorded twice (a retention run that crashed after recording it and before moving the
    group is redone by the next run) is returned once.
    """
    table = delta.open_table(layout.retention_skips_table)
    if table is None:
        return []
    flt = delta.matching({"group": group, "topic": topic}, ("skipped_at", since))
    seen: dict[tuple[str, str, int, int, int], RetentionSkip] = {}
    for r in delta.read_rows(table, flt).sort_by("skipped_at").to_pylist():
        key = (r["group"], r["topic"], r["partition"], r["from_offset"], r["to_offset"])
        seen.setdefault(key, RetentionSkip(r["group"], r["topic"], r["partition"], r["from_offset"],
                                           r["to_offset"], r["skipped_at"], r["run_id"]))
    return list(seen.values())


def summarize(skips: Iterable[RetentionSkip]) -> dict[GroupPartition, SkipSummary]:
    """Per (group, topic, partition): the number of skips, the messages skipped, the latest skip."""
    out: dict[GroupPartition, SkipSummary] = {}
    for s in skips:
        key = (s.group, s.topic, s.partition)
        seen = out.get(key)
        if seen is None:
            out[key] = SkipSummary(1, s.skipped_messages, s)
        else:
            last = s if s.skipped_at >= seen.last.skipped_at else seen.last
            out[key] = SkipSummary(seen.skips + 1, seen.messages + s.skipped_messages, last)
    return out
