"""The soak's counts of one run and its violations, and the Result they make: each invariant a Check."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bench.result import Check, Result, table

DELIVERY_RSS_MB = 1024  # the delivery workers' peak RSS, 1 MiB messages to a lagging subscription included
REMOVERS = ("retention", "key-compaction")  # the jobs whose rows_removed are rows gone from a topic


@dataclass
class SoakReport:
    minutes: float
    nodes: int = 1  # serve processes: more than one is a cluster sharing a table root, killed one at a time
    seconds: float = 0.0
    acked: int = 0
    in_delta: int = 0
    duplicates: int = 0  # ids stored more than once
    gaps: int = 0  # partitions not dense from log start to log end, or with a log start but no retention
    lost: int = 0  # acknowledged, above the log start, not in the table at their offset
    moved_after_failover: int = 0  # cluster, ack=wal: appended again at another offset after a failover
    removed_by_retention: int = 0  # acknowledged, then removed by retention (after delivery)
    compacted_away: int = 0  # acknowledged on `profiles`, superseded and removed by key compaction
    expected_deliveries: int = 0
    delivered: int = 0
    delivered_more_than_once: int = 0
    dead_lettered: int = 0
    compacted_before_delivery: int = 0
    skipped: int = 0  # neither delivered nor dead-lettered
    retention_skips: int = 0  # messages the retention job moved a group past
    wrong_content: int = 0  # a delivery whose body is not the table's row at that offset
    stalled_partitions: int = 0  # subscription partitions with lag or in-flight sends when the drain timed out
    serve_kills: int = 0
    worker_kills: int = 0
    recreates: int = 0
    policy_patches: int = 0  # cleanup_policy PATCHes of `profiles` under load
    mixed_wal_restarts: int = 0  # restarts of serve whose WAL held batch chunks and singles of one partition
    silent_clients: list[float | None] = field(default_factory=list)  # s until the server closed each; None: open
    silent_open: int = 0  # silent clients not closed in time, or not measured
    delivery_peak_rss_mb: float = 0.0  # the largest peak RSS of a delivery worker process
    receiver_answers: dict[str, int] = field(default_factory=dict)
    producer: dict[str, int] = field(default_factory=dict)
    job_starts: dict[str, int] = field(default_factory=dict)  # job -> runs the scheduler started
    job_runs: dict[str, dict[str, int]] = field(default_factory=dict)  # job -> outcome -> runs recorded
    rows_removed: dict[str, int] = field(default_factory=dict)  # job -> rows removed in all
    jobs_without_success: int = 0  # required jobs with no run that ended ok
    retention_idle: int = 0  # topics with retention from which retention removed nothing
    jobs_wait_timed_out: int = 0  # 1 when the jobs after the drain did not end in time
    # A cluster's nemesis (bench/soak/nemesis.py): its seed, the faults it drew, those it injected, and
    # after each SIGKILL or SIGSTOP of a node, each of its partitions' time until a produce to it was answered.
    seed: int | None = None
    fault_schedule: list[str] = field(default_factory=list)
    faults_planned: dict[str, int] = field(default_factory=dict)  # kind -> slots drawn
    faults: dict[str, int] = field(default_factory=dict)  # kind -> injected
    faults_missing: int = 0  # kinds injected fewer times than drawn
    faults_past_load: bool = False  # the last faults ran after the load ended (a short run's slots overran)
    nemesis_log: list[str] = field(default_factory=list)
    outages: list[dict[str, Any]] = field(default_factory=list)  # fault, node, topic, partition, seconds
    outage_bound_s: float = 0.0  # TTL + heartbeat + slack
    outages_over_bound: int = 0  # partitions unavailable longer than the bound after their owner died
    clock_refusals: int = 0  # nodes restarted with their clock off that took no partition and said so
    moves: int = 0  # `lakebroker cluster move`s seen done in GET /v1/cluster
    stranded_stops: int = 0  # graceful leaves that kept acknowledged messages in the WAL until the restart
    probes_acked: int = 0
    acked_by_mode: dict[str, int] = field(default_factory=dict)  # "ack=table, keyed" -> acknowledged messages
    replica_verified: bool = False
    replica_output: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def checks(r: SoakReport) -> list[Check]:
    def none(name: str, value: float, unit: str) -> Check:
        return Check(name, value, unit, 0, higher_is_better=False)

    nemesis = [
        none("fault kinds injected fewer times than the schedule drew", r.faults_missing, "kinds"),
        none("partitions unavailable longer than TTL + heartbeat + slack after their owner died",
             r.outages_over_bound, "partitions"),
    ] if r.nodes > 1 and r.faults_planned else []
    return [
        *nemesis,
        none("acknowledged messages lost from Delta", r.lost, "messages"),
        none("ids stored more than once in Delta", r.duplicates, "ids"),
        none("partitions with offset gaps", r.gaps, "partitions"),
        none("offsets neither delivered nor dead-lettered", r.skipped, "offsets"),
        none("deliveries of another message than the table's", r.wrong_content, "deliveries"),
        none("undelivered messages retention moved a group past", r.retention_skips, "messages"),
        none("subscription partitions stalled at the end of the drain", r.stalled_partitions, "partitions"),
        none("verify-replica failures", 0 if r.replica_verified else 1, "runs"),
        Check("delivery worker peak RSS", r.delivery_peak_rss_mb, "MB", DELIVERY_RSS_MB, higher_is_better=False),
        none("silent clients not closed by the server within 15 s", r.silent_open, "clients"),
        Check("serve restarts whose WAL held batch chunks and singles of one partition", r.mixed_wal_restarts,
              "restarts", 1),
        Check("cleanup_policy PATCHes of `profiles` under load", r.policy_patches, "PATCHes", 2),
        none("required jobs with no successful run", r.jobs_without_success, "jobs"),
        none("topics with retention it removed nothing from", r.retention_idle, "topics"),
        none("waits for the jobs after the drain that timed out", r.jobs_wait_timed_out, "waits"),
    ]


def passed(result: Result) -> bool:
    return not result.figures["problems"] and all(c.met for c in result.checks)


def to_result(r: SoakReport) -> Result:
    jobs = "; ".join(f"{job}: {r.job_starts.get(job, 0)} started, " + (", ".join(
        f"{n} {o}" for o, n in sorted(r.job_runs.get(job, {}).items())) or "none ended")
        + (f" ({r.rows_removed[job]:,} rows removed)" if job in REMOVERS and r.rows_removed.get(job) else "")
        for job in sorted({*r.job_starts, *r.job_runs}))
    closed = [t for t in r.silent_clients if t is not None]
    rows: list[Any] = [
        ("messages acknowledged", f"{r.acked:,}"),
        ("rows in Delta (checked topics, at the end)", f"{r.in_delta:,}"),
        ("removed by retention (after delivery) / by key compaction", f"{r.removed_by_retention:,} / "
         f"{r.compacted_away:,}"),
        ("offsets to deliver", f"{r.expected_deliveries:,}"),
        ("delivered / of them more than once", f"{r.delivered:,} / {r.delivered_more_than_once:,}"),
        ("dead-lettered", f"{r.dead_lettered:,}"),
        ("compacted away before delivery (`profiles`)", f"{r.compacted_before_delivery:,}"),
        *([("acknowledged at ack=wal, stored at another offset after their node's failover",
            f"{r.moved_after_failover:,}")] if r.nodes > 1 else []),
        ("SIGKILLs of serve / of a worker" if r.nodes == 1 else f"SIGKILLs of a node (of {r.nodes}) / of a worker",
         f"{r.serve_kills} / {r.worker_kills}"),
        ("topic re-creates", f"{r.recreates}"),
        *(_nemesis_rows(r) if r.faults_planned else []),
        ("restarts of serve whose WAL held batch chunks and singles of one partition",
         f"{r.mixed_wal_restarts} of {r.serve_kills}"),
        ("silent clients after an early answer closed by the server / slowest",
         f"{len(closed)} of {len(r.silent_clients)} / " + (f"{max(closed):.1f} s" if closed else "none")),
        ("job runs (scheduler; a run cut short by a SIGKILL of serve records no outcome)", jobs or "none"),
        ("receiver answers", ", ".join(f"{k}: {v:,}" for k, v in sorted(r.receiver_answers.items()))),
        ("producer", ", ".join(f"{k}: {v:,}" for k, v in sorted(r.producer.items()))),
    ]
    result = Result(scenario="soak" if r.nodes == 1 else "soak_cluster", checks=checks(r),
                    tables=[table("", ["figure", "value"], rows)],
                    figures={k: v for k, v in dataclasses.asdict(r).items() if k != "replica_output"}
                    | {"replica_tail": r.replica_output.strip().splitlines()[-3:]})
    failed = [c.name for c in result.checks if not c.met]
    result.notes.append(
        f"{r.acked:,} messages acknowledged in {r.minutes:g} min of load ({r.seconds / 60:.1f} min in all), "
        f"through {r.serve_kills} SIGKILLs of {_serve(r)} and {r.worker_kills} of a delivery worker: {r.lost} lost, "
        f"{r.duplicates} stored twice, {r.skipped} offsets neither delivered nor dead-lettered; "
        f"{r.delivered_more_than_once:,} offsets were delivered more than once (delivery is at least once). "
        f"The delivery workers peaked at {r.delivery_peak_rss_mb:.0f} MB of RSS.")
    if r.faults_planned:
        known = [o["seconds"] for o in r.outages if o["seconds"] is not None]
        result.notes.append(
            f"The nemesis (seed {r.seed}) injected " + ", ".join(f"{n} {k}" for k, n in sorted(r.faults.items()))
            + f"; after the SIGKILLs and SIGSTOPs, {len(r.outages)} partitions of the stopped nodes were probed, "
            + (f"the longest back after {max(known):.1f} s" if known else "none answered")
            + f" (bound: TTL + heartbeat + slack, {r.outage_bound_s:g} s); {r.clock_refusals} nodes restarted with "
            f"their clock off held no partition; {r.moves} partition moves were done under load.")
    if failed or r.problems:
        result.notes.append("**Failed**: " + ("; ".join(failed) or "violations no check counts") + "."
                            + "".join(f"\n- {p}" for p in r.problems[:20]))
    verdict = "every invariant holds" if passed(result) else f"FAILED ({len(failed)} checks not met)"
    result.headlines.append(f"{r.acked:,} messages acknowledged through {r.serve_kills} SIGKILLs of {_serve(r)}: "
                            f"{verdict}")
    return result


def _serve(r: SoakReport) -> str:
    return "serve" if r.nodes == 1 else f"a node of {r.nodes}"


def _nemesis_rows(r: SoakReport) -> list[tuple[str, str]]:
    def longest(fault: str) -> str:
        times = [o["seconds"] for o in r.outages if o["fault"] == fault]
        if not times:
            return "none probed"
        known = [t for t in times if t is not None]
        never = len(times) - len(known)
        return (f"{len(times)} partitions, longest {max(known):.1f} s" if known else f"{len(times)} partitions") + (
            f", {never} never back" if never else "")

    return [
        (f"faults injected / drawn (seed {r.seed})", ", ".join(
            f"{k}: {r.faults.get(k, 0)} / {n}" for k, n in sorted(r.faults_planned.items()))
         + (" (the last after the load ended)" if r.faults_past_load else "")),
        (f"outage after a SIGKILL / a SIGSTOP of its owner (bound {r.outage_bound_s:g} s"
         + ")",
         f"{longest('kill')} / {longest('pause')}" + f" ({r.outages_over_bound} over the bound)"),
        ("nodes restarted with their clock off that held no partition and said so", f"{r.clock_refusals}"),
        ("`lakebroker cluster move`s done", f"{r.moves}"),
        ("acknowledged by ack and key", ", ".join(f"{k}: {v:,}" for k, v in r.acked_by_mode.items())),
    ]
