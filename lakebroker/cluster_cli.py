"""`lakebroker cluster show|move`: the nodes sharing this table root and who owns each partition;
a partition moved to a node by hand. Both read and write the ownership table directly
(tables/ownership.py), so they work from any machine that reaches the tables, server or not."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import orjson
import typer

from lakebroker.console import out, print_rows
from lakebroker.tables.settings import Settings


def register(app: typer.Typer, settings: Callable[[], Settings], fail: Callable[[str, int], typer.Exit]) -> None:
    cluster_app = typer.Typer(no_args_is_help=True,
                              help="The ingest nodes sharing this table root, and who owns each partition.")
    app.add_typer(cluster_app, name="cluster")

    @cluster_app.command("show")
    def show(
        json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    ) -> None:
        """The nodes (id, URL, alive, draining) and every topic partition's owner, epoch and pin."""
        found = _show(settings())
        if json_out:
            sys.stdout.buffer.write(orjson.dumps(found, option=orjson.OPT_INDENT_2) + b"\n")
            return
        print_rows(["node", "url", "alive", "draining", "partitions", "lease_expires_at"],
                   [[n["id"], n["url"], n["alive"], n["draining"], n["partitions"], n["lease_expires_at"]]
                    for n in found["nodes"]])
        print_rows(["topic", "partition", "owner", "epoch", "pinned_to"],
                   [[p["topic"], p["partition"], p["owner"] or "-", p["epoch"], p["pinned_to"] or ""]
                    for p in found["partitions"]])

    @cluster_app.command("move")
    def move(
        topic: str,
        partition: Annotated[int, typer.Argument(min=0)],
        to: Annotated[str | None, typer.Option("--to", help="The node id to move it to (see `cluster show`).")] = None,
        auto: Annotated[bool, typer.Option("--auto", help="Give it back to the balanced plan.")] = False,
    ) -> None:
        """Move a partition to a node and keep it there while that node lives: its owner stops taking
        messages for it, commits what it holds and releases it, and the node claims it (a second or two).
        `--auto` lets the plan place it again."""
        if (to is None) == (not auto):
            raise fail("give either --to NODE or --auto", 2)
        from lakebroker.tables.layout import Layout
        from lakebroker.tables.ownership import OwnershipTable, read_view
        from lakebroker.tables.topics import TopicStore

        layout = Layout.of(settings())
        config = TopicStore(layout).get(topic)
        if partition >= config.partitions:
            raise fail(f"topic {topic!r} has partitions 0 to {config.partitions - 1}", 1)
        view = read_view(layout)
        if to is not None and to not in view.live_nodes():
            live = ", ".join(sorted(view.live_nodes())) or "none"
            raise fail(f"no live node {to!r} (live nodes: {live})", 1)
        OwnershipTable(layout, node="cli", url="", ttl_s=0).pin((config.topic_id, partition), topic, to)
        out.print(f"{topic}[{partition}] pinned to {to}" if to else f"{topic}[{partition}] back to the plan",
                  highlight=False)


def _show(settings: Settings) -> dict[str, Any]:
    from lakebroker.tables.layout import Layout
    from lakebroker.tables.ownership import read_view
    from lakebroker.tables.topics import TopicStore

    layout = Layout.of(settings)
    view = read_view(layout)
    live = view.live_nodes()
    partitions = []
    for topic in sorted(TopicStore(layout).load().values(), key=lambda t: t.name):
        for p in range(topic.partitions):
            owner = view.owner_of((topic.topic_id, p))
            row = view.owners.get((topic.topic_id, p))
            partitions.append({"topic": topic.name, "partition": p, "owner": owner.node if owner else None,
                               "epoch": row.epoch if row else 0, "pinned_to": view.pins.get((topic.topic_id, p))})
    nodes = [{"id": n.node, "url": n.url, "alive": n.node in live, "draining": n.draining,
              "lease_expires_at": n.expires_at.isoformat(),
              "partitions": sum(1 for p in partitions if p["owner"] == n.node)} for n in view.nodes]
    return {"nodes": nodes, "partitions": partitions}
