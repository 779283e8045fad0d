"""`lakebroker wal inspect|skip`: read the write-ahead log, and move a partition past WAL damage.

`inspect` only reads (the WAL files and the tables), so it runs beside a server too. `skip` goes
through the data dir's broker (lakebroker/access.py): the running server's API, or an embedded
broker whose recovery finds the damage.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import orjson
import typer

from lakebroker.console import out, print_rows
from lakebroker.tables.settings import Settings


def register(app: typer.Typer, settings: Callable[[], Settings], fail: Callable[[str, int], typer.Exit]) -> None:
    wal_app = typer.Typer(no_args_is_help=True,
                          help="Inspect the write-ahead log; move a partition past offsets WAL damage lost.")
    app.add_typer(wal_app, name="wal")

    @wal_app.command("inspect")
    def inspect(
        json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    ) -> None:
        """Read the WAL without changing it: segments, torn and corrupt bytes, the offsets each
        damaged partition lost (held until `wal skip`), and the losses already skipped."""
        found = _inspect(settings())
        if json_out:
            sys.stdout.buffer.write(orjson.dumps(found, option=orjson.OPT_INDENT_2) + b"\n")
            return
        print_rows(["segment", "bytes", "messages", "batch_chunks"],
                   [[s["segment"], s["size"], s["records"], s["chunks"]] for s in found["segments"]])
        print(f"torn bytes at the end (truncated at the next start): {found['torn_bytes']}")
        print(f"corrupt spans: {len(found['corrupt'])}")
        for span in found["corrupt"]:
            print(f"  {span['segment']} bytes {span['start']}-{span['end']}")
        if found["damage"]:
            print("lost offsets, held until `lakebroker wal skip TOPIC PARTITION`:")
            print_rows(["topic", "partition", "first_offset", "last_offset", "lost"],
                       [[d["topic"], d["partition"], d["first_offset"], d["last_offset"], d["lost"]]
                        for d in found["damage"]])
        else:
            print("lost offsets awaiting a skip: none")
        if found["skipped"]:
            print("losses recorded by earlier skips (_system/lost_offsets):")
            print_rows(["topic", "partition", "first_offset", "last_offset", "skipped_at", "skipped_by"],
                       [[s["topic"], s["partition"], s["first_offset"], s["last_offset"], s["skipped_at"],
                         s["skipped_by"]] for s in found["skipped"]])

    @wal_app.command("skip")
    def skip(
        topic: str,
        partition: Annotated[int, typer.Argument(min=0)],
        yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
    ) -> None:
        """Record the first range of offsets WAL damage cost this partition as lost, in
        `_system/lost_offsets` and on the topic's table, and let the partition move on past them.
        Consumers see the range as an explicit gap. Run again for a further range."""
        from lakebroker.access import broker_access
        from lakebroker.tables.layout import validate_name

        validate_name(topic)
        if not yes and not typer.confirm(
                f"record the offsets WAL damage lost in partition {partition} of {topic} as lost, and move on?"):
            raise fail("nothing skipped", 1)
        with broker_access(settings(), this_node=True) as broker:
            loss = broker.skip_lost(topic, partition)
        out.print(f"recorded offsets {loss['first_offset']}-{loss['last_offset']} of partition {partition} of {topic} "
                  f"as lost ({loss['wal_damage']}); the partition moves on", highlight=False, soft_wrap=True)


def _inspect(settings: Settings) -> dict[str, Any]:
    from dataclasses import asdict

    from lakebroker.ingest_api.wal import Wal
    from lakebroker.ingest_api.wal_damage import find_damage
    from lakebroker.tables.layout import Layout
    from lakebroker.tables.lost_offsets import lost_offsets
    from lakebroker.tables.topics import TopicStore, committed_ends

    layout = Layout.of(settings)
    report = Wal(layout.wal_dir, segment_bytes=settings.wal_segment_bytes, fsync=False).inspect()
    topics = TopicStore(layout).load()
    committed = committed_ends(layout, topics.values())  # read only: nothing is marked
    names = {bytes.fromhex(t.topic_id): t.name for t in topics.values()}
    damage = find_damage(report.items, committed, names, report.corrupt)
    return {
        "segments": [asdict(s) for s in report.segments],
        "torn_bytes": report.torn_bytes,
        "corrupt": [asdict(c) for c in report.corrupt],
        "damage": [d.public() for d in damage],
        "skipped": [{**asdict(s), "skipped_at": s.skipped_at.isoformat()} for s in lost_offsets(layout)],
    }
