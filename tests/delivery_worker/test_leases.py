"""The lease table's heartbeat (delivery_worker/leases.py) on a real Delta state table."""

from __future__ import annotations

from pathlib import Path

from lakebroker.tables.layout import Layout
from lakebroker.tables.leases import LeaseTable


def test_a_lease_leaves_the_plan_and_goes_at_once_when_no_pipeline_runs_for_it(tmp_path: Path) -> None:
    """A pair leaves this worker's plan (its subscription paused, say). With a pipeline running,
    the lease is kept until the pipeline has stopped; with none, it is released at the same
    heartbeat, never renewed for good with a status that no longer means anything."""
    leases = LeaseTable(Layout(tmp_path / "data"), "worker-a", ttl_s=30)
    running, idle = ("hooks", 0), ("hooks", 1)
    held = leases.heartbeat([running, idle], set(), {}, {})
    assert set(held) == {running, idle}
    status = '{"in_flight": 1}'
    held = leases.heartbeat([], set(), {running: status}, {})  # both left the plan; only one runs
    assert set(held) == {running}
    rows = leases.leases()
    assert rows[running].owner == "worker-a" and rows[running].status == status
    assert rows[idle].owner is None
    held = leases.heartbeat([], {running}, {running: '{"in_flight": 0}'}, {})  # its pipeline stopped
    assert held == {} and leases.leases()[running].owner is None
