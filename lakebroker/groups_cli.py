"""`lakebroker groups list|seek`: the consumer groups that are no subscription (pull consumers and
Spark streams, `lakebroker.spark.read_topic_stream(group=...)`), their positions and lag, and an
operator's move of one, as Kafka's `kafka-consumer-groups --reset-offsets` does.

Both read and write the tables directly (the consumer-offsets table and the topic's Delta log),
so they work from any machine that reaches the tables, server or not. A group's end is the end of
what its topic's table holds: the messages a pull consumer or a stream can read.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

import orjson
import typer

from lakebroker.console import out, print_rows
from lakebroker.tables.settings import Settings


class Edge(StrEnum):
    EARLIEST = "earliest"
    LATEST = "latest"


def register(app: typer.Typer, settings: Callable[[], Settings], fail: Callable[[str, int], typer.Exit]) -> None:
    groups_app = typer.Typer(no_args_is_help=True, help="Consumer groups of pull consumers and Spark streams: "
                                                        "positions, lag, and moving them.")
    app.add_typer(groups_app, name="groups")

    @groups_app.command("list")
    def list_groups(
        topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic's groups.")] = None,
        group: Annotated[str | None, typer.Option("--group", "-g", help="Only this group.")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="One JSON array on stdout.")] = False,
    ) -> None:
        """Each group's committed position per partition, the partition's end and the lag between them."""
        rows = _lags(settings(), topic, group)
        if json_out:
            sys.stdout.buffer.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2) + b"\n")
            return
        columns = ["group", "topic", "partition", "committed_offset", "high_watermark", "lag", "reason"]
        print_rows(columns, [[r[c] for c in columns] for r in rows])

    @groups_app.command("seek")
    def seek(
        topic: str,
        group: str,
        to: Annotated[Edge | None, typer.Option("--to", help="Every partition's first or end offset.")] = None,
        timestamp: Annotated[str | None, typer.Option(
            "--timestamp", help="Every partition's first message at or after this time (ISO 8601, UTC when no "
                                "zone is given, or epoch milliseconds); the end where none is.")] = None,
        offset: Annotated[list[str] | None, typer.Option(
            "--offset", help="PARTITION=OFFSET, the next offset to read; repeat for more partitions (the others "
                             "keep their positions).")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the moves, commit nothing.")] = False,
    ) -> None:
        """Move a group: the next offset each partition's consumer reads. A running Spark stream follows
        its checkpoint, not the group: move a stream's group before starting a query without one."""
        given = [x for x in (to, timestamp, offset) if x]
        if len(given) != 1:
            raise fail("give exactly one of --to, --timestamp or --offset", 2)
        moves = _seek(settings(), topic, group, to=to, timestamp=timestamp, offsets=_offsets(offset or [], fail),
                      commit=not dry_run)
        print_rows(["partition", "from", "to"], [[p, "-" if before is None else before, after]
                                                 for p, (before, after) in sorted(moves.items())])
        verb = "would move" if dry_run else "moved"
        out.print(f"{verb} group {group} on {topic}: {len(moves)} partition(s)", highlight=False)


def _offsets(given: list[str], fail: Callable[[str, int], typer.Exit]) -> dict[int, int]:
    parsed: dict[int, int] = {}
    for item in given:
        partition, sep, offset = item.partition("=")
        if not sep or not (partition.isascii() and partition.isdigit()) or not (offset.isascii() and offset.isdigit()):
            raise fail(f"--offset takes PARTITION=OFFSET with whole numbers, got {item!r}", 2)
        if int(partition) in parsed:
            raise fail(f"--offset names partition {int(partition)} twice", 2)
        parsed[int(partition)] = int(offset)
    return parsed


def _lags(settings: Settings, topic: str | None, group: str | None) -> list[dict[str, Any]]:
    from lakebroker.ingest_api.reader import partition_files
    from lakebroker.tables.layout import Layout
    from lakebroker.tables.offsets import OffsetsTable, pull_group, pull_group_lags
    from lakebroker.tables.topics import TopicConfig, TopicStore

    layout = Layout.of(settings)
    store = TopicStore(layout)
    topics = store.load()
    if topic is not None:
        topics = {topic: store.get(topic)}  # NotFound names it
    ends: dict[str, dict[int, int]] = {}

    def end(config: TopicConfig, partition: int) -> int:
        if config.name not in ends:
            ends[config.name] = {p: log.committed_end for p, log in partition_files(layout, config).items()}
        return ends[config.name].get(partition, 0)

    committed = OffsetsTable(layout).latest(None if group is None else pull_group(group))
    return pull_group_lags(committed, topics, end)


def _seek(settings: Settings, topic: str, group: str, *, to: Edge | None, timestamp: str | None,
          offsets: dict[int, int], commit: bool) -> dict[int, tuple[int | None, int]]:
    """Each moved partition's position before and after."""
    from lakebroker.ingest_api.reader import offset_for_timestamp, partition_files
    from lakebroker.ingest_api.routes.consume import parse_timestamp
    from lakebroker.tables.errors import OutOfRange
    from lakebroker.tables.layout import Layout
    from lakebroker.tables.offsets import OffsetReason, OffsetsTable, pull_group
    from lakebroker.tables.topics import TopicStore

    layout = Layout.of(settings)
    name = pull_group(group)
    config = TopicStore(layout).get(topic)
    logs = partition_files(layout, config)  # one snapshot: every partition's log start and end
    starts = {p: logs[p].log_start if p in logs else 0 for p in range(config.partitions)}
    ends = {p: logs[p].committed_end if p in logs else 0 for p in range(config.partitions)}
    targets: dict[int, int] = {}
    if offsets:
        for p, wanted in offsets.items():
            config.check_partition(p)
            if not starts[p] <= wanted <= ends[p]:
                raise OutOfRange(f"offset {wanted} is outside partition {p} of {topic}: valid positions are "
                                 f"{starts[p]} (its log start) to {ends[p]} (its end)")
            targets[p] = wanted
    elif to is not None:
        targets = dict(starts) if to is Edge.EARLIEST else dict(ends)
    else:
        assert timestamp is not None
        micros = parse_timestamp(timestamp)
        for p in range(config.partitions):
            found = offset_for_timestamp(layout, config, p, micros)
            targets[p] = ends[p] if found is None else found
    offsets_table = OffsetsTable(layout)
    before = offsets_table.of_topic(name, topic)
    if commit:
        offsets_table.commit(name, topic, targets, OffsetReason.SEEK)
    return {p: (before.get(p), target) for p, target in targets.items()}
