"""The soak's accounting of acknowledged messages against the table, on hand-made tables: what it
accepts in a cluster (a message appended again after its node's failover) and what it calls lost."""

from __future__ import annotations

from typing import Any

import pytest

from bench.soak.checks import Stored, TopicSpec, check_table
from bench.soak.report import SoakReport
from lakebroker.tables.log_start import PartitionLog


def _stored(rows: dict[int, tuple[str, str]]) -> Stored:
    """Partition 0's rows, offset -> (id, key), committed to 90."""
    log = PartitionLog(partition=0, files=1, rows=len(rows), size_bytes=0, log_start=0, committed_end=90)
    newest: dict[tuple[int, str], int] = {}
    for o, (_, key) in rows.items():
        newest[(0, key)] = max(o, newest.get((0, key), -1))
    return Stored({0: log}, {(0, o): i for o, (i, _) in rows.items()}, newest)


# offset 85 reused by another node after the failover; 87 (where the message went again) compacted away
AFTER_FAILOVER = {85: ("other", "k7"), 86: ("m-86", "k20"), 88: ("newer", "k28")}
ACK = {"partition": 0, "offset": 85, "id": "moved", "key": "k28", "ack": "wal", "sent": 1_800_000_000.0,
       "acked": 1_800_000_000.5, "kind": "single", "node": "127.0.0.1:8001"}


def _check(nodes: int, spec: TopicSpec, rows: dict[int, tuple[str, str]], ack: dict[str, Any]) -> SoakReport:
    report = SoakReport(minutes=1, nodes=nodes)
    check_table(report, "profiles", spec, _stored(rows), [ack])
    return report


def test_a_message_moved_after_a_failover_then_compacted_away_is_accounted() -> None:
    report = _check(3, TopicSpec(1, compact=True), AFTER_FAILOVER, ACK)
    assert (report.lost, report.compacted_away, report.problems) == (0, 1, [])


def test_a_message_appended_again_below_its_acknowledged_offset_is_accounted() -> None:
    """Acknowledged at 88 by a node that lost the partition before its commit; the next owner found
    the end at 85 and the message went in again there (seen in `make soak-cluster`)."""
    rows = {85: ("moved", "k1"), 86: ("m-86", "k2"), 88: ("other", "k3")}
    report = _check(3, TopicSpec(1), rows, {**ACK, "offset": 88, "key": "k1"})
    assert (report.lost, report.moved_after_failover) == (0, 1), report.problems


@pytest.mark.parametrize(("nodes", "spec", "rows", "ack"), [
    (1, TopicSpec(1, compact=True), AFTER_FAILOVER, ACK),  # one node never gives an offset away
    (3, TopicSpec(1), AFTER_FAILOVER, ACK),  # nothing compacts a plain topic
    (3, TopicSpec(1, compact=True), {85: ("other", "k7"), 88: ("newer", "k9")}, ACK),  # its key never came again
    (3, TopicSpec(1, compact=True), AFTER_FAILOVER, {**ACK, "ack": "table"}),  # in the table when acknowledged
])
def test_what_no_failover_or_compaction_explains_is_lost(nodes: int, spec: TopicSpec,
                                                         rows: dict[int, tuple[str, str]], ack: dict[str, Any]) -> None:
    report = _check(nodes, spec, rows, ack)
    assert report.lost == 1 and report.problems, report
    assert any(f"acknowledged moved, stored other (ack={ack['ack']} by 127.0.0.1:8001 at 1800000000.5)" in p
               for p in report.problems), report.problems
