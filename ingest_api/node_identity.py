"""Who this node is: its id (kept in its data dir), the URL it advertises, and the credential it
sends its own requests with. Refuses to start as a node another live process already is. And the
id of the cluster it belongs to, as Kafka's clients and the REST Proxy v3 name it."""

from __future__ import annotations

import socket
import time
import uuid
from datetime import UTC, datetime

from lakebroker.ingest_api.auth import auth_enforced
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.layout import Layout
from lakebroker.tables.ownership import NodeInfo, OwnershipTable
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import TokenStore

TWIN_POLL_S = 0.25
CLUSTER_ID = "lakebroker"  # Kafka's Metadata and DescribeCluster, and REST Proxy v3's /v3/clusters/{id}


def node_id(layout: Layout) -> str:
    """This data dir's node id: made once, kept in the data dir (its WAL's records are the node's)."""
    path = layout.node_file
    if path.is_file():
        return path.read_text().strip()
    node = uuid.uuid4().hex[:12]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(node + "\n")
    tmp.replace(path)
    return node


class NodeIdInUse(LakebrokerError):
    code = "node_id_in_use"


def refuse_twin(settings: Settings) -> None:
    """Refuse to start as a node another live process already is. A data dir copied to a second
    machine brings its node id along, and two processes heartbeating as one node would take each
    other's leases. A live row of this id at another URL is watched until its lease runs out: if it
    is renewed meanwhile, its process is alive. (At this node's own URL it is this node's previous
    process: the data-dir lock and the port rule out a second one.)"""
    layout = Layout.of(settings)
    node, url = node_id(layout), advertised_url(settings)
    ownership = OwnershipTable(layout, node, url, settings.ingest_lease_ttl_s)

    def row() -> NodeInfo | None:
        return next((n for n in ownership.view().nodes if n.node == node), None)

    seen = row()
    if seen is None or seen.url == url:
        return
    while seen.alive(datetime.now(UTC)):
        time.sleep(TWIN_POLL_S)
        latest = row()
        if latest is not None and latest.expires_at != seen.expires_at:
            raise NodeIdInUse(
                f"node {node} (the id in {layout.node_file}) is alive at {seen.url}: this data dir is a copy "
                "of that node's, or another process serves it. Give each node its own --data-dir; a copy "
                f"made for a new node needs {layout.node_file} deleted first")
        seen = latest or seen


def node_credential(settings: Settings, layout: Layout, node: str) -> str | None:
    """The Authorization header this node sends its own requests with (the WAL items it hands to
    another node): a produce-scoped token it made once and keeps in its data dir. None without auth."""
    if not auth_enforced(settings):
        return None
    path = layout.data_dir / "node_token"
    if not path.is_file():
        _, text = TokenStore(layout).create(["produce"], name=f"lakebroker node {node}")
        tmp = path.with_suffix(".tmp")
        tmp.touch(mode=0o600)
        tmp.write_text(text + "\n")
        tmp.replace(path)
    return "Bearer " + path.read_text().strip()


def advertised_url(settings: Settings) -> str:
    if settings.advertised_url:
        return settings.advertised_url.rstrip("/")
    host = socket.getfqdn() if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://[{host}]:{settings.port}" if ":" in host else f"http://{host}:{settings.port}"
