"""The soak's accounting of acknowledged messages against the table, on hand-made tables: what it
accepts in a cluster (a message appended again after its node's failover) and what it calls lost; and
the cluster soak's nemesis: its seeded schedule, and the checks of the faults it injected."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from bench.scenarios.soak import MINUTES
from bench.scenarios.soak_cluster import SEED
from bench.soak import SoakPlan
from bench.soak.checks import Stored, TopicSpec, check_nemesis, check_table
from bench.soak.nemesis import Fault, schedule
from bench.soak.report import SoakReport, passed, to_result
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


# --- the cluster soak's nemesis: its schedule and its checks ---


def test_a_schedule_is_drawn_from_its_seed_and_holds_every_kind_its_share_of_times() -> None:
    assert schedule(7, 30) == schedule(7, 30) != schedule(8, 30)
    assert Counter(schedule(7, 30)) == {kind: 5 for kind in Fault}  # `make soak-cluster`: each kind five times
    assert Counter(schedule(SEED, SoakPlan.for_minutes(10).fault_slots)) == {kind: 5 for kind in Fault}
    assert SoakPlan.for_minutes(MINUTES["quick"]).fault_slots == 0  # the short form: SIGKILLs every period


def _nemesis_report(**change: Any) -> SoakReport:
    report = SoakReport(minutes=1, nodes=3, replica_verified=True, mixed_wal_restarts=1, policy_patches=2,
                        faults_planned={"kill": 2, "pause": 1}, faults={"kill": 2, "pause": 1},
                        outage_bound_s=8.5, outages=[
                            {"fault": "kill", "node": "127.0.0.1:1", "topic": "orders", "partition": 1, "seconds": 5.2},
                            {"fault": "pause", "node": "127.0.0.1:2", "topic": "events", "partition": 0,
                             "seconds": 8.4}])
    return dataclasses.replace(report, **change)


def test_a_nemesis_run_whose_faults_ran_and_partitions_came_back_in_time_passes() -> None:
    report = _nemesis_report()
    check_nemesis(report)
    assert (report.faults_missing, report.outages_over_bound, report.problems) == (0, 0, [])
    result = to_result(report)
    assert [c.name for c in result.checks if not c.met] == []
    rows = {row[0]: row[1] for row in result.tables[0].rows}
    assert rows["outage after a SIGKILL / a SIGSTOP of its owner (bound 8.5 s)"] == (
        "1 partitions, longest 5.2 s / 1 partitions, longest 8.4 s (0 over the bound)")


@pytest.mark.parametrize(("change", "check", "problem"), [
    ({"faults": {"kill": 2}}, "fault kinds injected fewer times than the schedule drew", "pause 0 of 1"),
    ({"outages": [{"fault": "pause", "node": "n", "topic": "orders", "partition": 3, "seconds": 9.1}]},
     "partitions unavailable longer than TTL + heartbeat + slack after their owner died",
     "orders[3] was unavailable for 9.1 s after a pause of its owner n (bound 8.5 s)"),
    ({"outages": [{"fault": "kill", "node": "n", "topic": "big", "partition": 0, "seconds": None,
                   "last_refusal": "12.3 s: http://m: 503 {\"error\": \"no owner yet\"}"}]},
     "partitions unavailable longer than TTL + heartbeat + slack after their owner died",
     "big[0] was not back after a kill of its owner n (bound 8.5 s); its last refusal, at 12.3 s: http://m: 503"),
])
def test_a_fault_not_injected_or_a_partition_back_too_late_fails_its_check(change: dict[str, Any], check: str,
                                                                           problem: str) -> None:
    report = _nemesis_report(**change)
    check_nemesis(report)
    assert any(problem in p for p in report.problems), report.problems
    result = to_result(report)
    assert [c.name for c in result.checks if not c.met] == [check]
    assert not passed(result)

