"""The soak's end-of-run checks: what it acknowledged, stored, delivered and ran, against its invariants.

Each check fills counts of a SoakReport and appends a sentence per violation to `problems`. They
read only what a run leaves behind (the acknowledgements, the Delta tables, the deliveries the
receiver recorded, the dead letters, the job runs), so they can be re-run on a kept work dir.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import orjson

from bench.soak.report import SoakReport
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_start import PartitionLog, partition_logs
from lakebroker.tables.topics import TopicStore

MAX_EXAMPLES = 5  # problems listed one by one per kind; the rest are counted


@dataclass(frozen=True)
class TopicSpec:
    partitions: int
    compact: bool = False  # key compaction may remove superseded keys
    retention: bool = False  # retention may move the log start
    subscribed: bool = False


@dataclass
class Stored:
    """One topic's table at the end: its rows by (partition, offset), and each partition's log."""

    logs: dict[int, PartitionLog]
    ids: dict[tuple[int, int], str]
    newest: dict[tuple[int, str], int]  # (partition, key) -> the newest stored offset of that key

    @classmethod
    def read(cls, uri: str, partitions: int) -> Stored:
        table = delta.load(uri)
        rows = table.to_pyarrow_table(columns=["partition", "offset", "message_id", "key", "value"]).to_pylist()
        ids: dict[tuple[int, int], str] = {}
        newest: dict[tuple[int, str], int] = {}
        for row in rows:  # a REST v2 record has no message id: its id is in its value
            p, o, key = row["partition"], row["offset"], row["key"]
            ids[(p, o)] = row["message_id"] or orjson.loads(row["value"])["id"]
            if key is not None:
                newest[(p, key)] = max(o, newest.get((p, key), -1))
        return cls(partition_logs(table, partitions), ids, newest)

    def superseded(self, partition: int, offset: int, key: str | None) -> bool:
        """A later row with the same key is stored: key compaction may have removed this one."""
        return key is not None and self.newest.get((partition, key), -1) > offset


def _note(report: SoakReport, count: int, text: str) -> None:
    if count <= MAX_EXAMPLES:
        report.problems.append(text)


def _answered(ack: dict[str, Any]) -> str:
    """Who acknowledged a message, and how: for a loss's example."""
    return f" (ack={ack.get('ack')} by {ack.get('node', '?')} at {ack['acked']:.1f})"


def check_table(report: SoakReport, topic: str, spec: TopicSpec, stored: Stored, acks: list[dict[str, Any]]) -> None:
    """Exactly once, dense from the log start, and every acknowledged message where it was acknowledged.
    In a cluster, a message acknowledged at ack=wal by a node that lost its partition before the
    commit is appended again (docs/cluster.md#failover): at a new offset of its partition, from the
    partition's end when that happens, which may be below the acknowledged offset when no owner
    committed up to it meanwhile."""
    report.in_delta += len(stored.ids)
    times = Counter(stored.ids.values())
    dups = [i for i, n in times.items() if n > 1]
    report.duplicates += len(dups)
    if dups:
        report.problems.append(f"{topic}: {len(dups)} ids stored more than once, e.g. {dups[:3]}")
    for p, log in stored.logs.items():
        offsets = sorted(o for q, o in stored.ids if q == p)
        if spec.compact:
            ok = all(log.log_start <= o < log.committed_end for o in offsets)
        else:
            ok = offsets == list(range(log.log_start, log.committed_end))
        stray = log.log_start > 0 and not (spec.retention or spec.compact)
        if not ok:
            report.problems.append(f"{topic}[{p}]: offsets not dense in {log.log_start}-{log.committed_end - 1} "
                                   f"({len(offsets)} rows)")
        if stray:
            report.problems.append(f"{topic}[{p}]: log start {log.log_start} on a topic without retention")
        report.gaps += not ok or stray
    offsets_of = {i: where for where, i in stored.ids.items()}
    for a in acks:
        where = (a["partition"], a["offset"])
        log = stored.logs[a["partition"]]
        moved = offsets_of.get(a["id"])
        if report.nodes > 1 and a.get("ack") == "wal" and stored.ids.get(where) != a["id"] and moved is not None \
                and moved[0] == a["partition"]:
            report.moved_after_failover += 1
        elif report.nodes > 1 and a.get("ack") == "wal" and spec.compact and moved is None \
                and stored.superseded(*where, a["key"]):
            # Appended again at another offset after its node's failover (its own is another message's
            # now, or compacted), then superseded there by a later row of its key and removed by key
            # compaction: seen in the cluster soak (acknowledged at 85, stored at 87, deleted for 88).
            report.compacted_away += 1
        elif where in stored.ids:
            if stored.ids[where] != a["id"]:
                report.lost += 1
                _note(report, report.lost,
                      f"{topic}{list(where)}: acknowledged {a['id']}, stored {stored.ids[where]}{_answered(a)}")
        elif spec.retention and a["offset"] < log.log_start:
            report.removed_by_retention += 1
        elif spec.compact and a["offset"] < log.committed_end and stored.superseded(*where, a["key"]):
            report.compacted_away += 1
        else:
            report.lost += 1
            _note(report, report.lost, f"{topic}{list(where)}: acknowledged {a['id']} is not in the table "
                  f"(log {log.log_start}-{log.committed_end}){_answered(a)}")


def check_delivery(report: SoakReport, topic: str, spec: TopicSpec, stored: Stored,
                   delivered: dict[tuple[int, int], dict[str, Any]], dead: set[tuple[int, int]]) -> None:
    """Every offset below the log end delivered or dead-lettered; on a compacted topic, an offset
    compacted away before delivery is counted apart. A delivery must carry the stored message."""
    report.dead_lettered += len(dead)
    for p, log in stored.logs.items():
        for o in range(log.committed_end):
            report.expected_deliveries += 1
            body = delivered.get((p, o))
            if body is not None:
                value = body.get("value")
                got = body.get("id") or (value.get("id") if isinstance(value, dict) else None)
                if (p, o) in stored.ids and got != stored.ids[(p, o)]:
                    report.wrong_content += 1
                    _note(report, report.wrong_content, f"{topic}[{p}] offset {o}: delivered {got}, stored "
                          f"{stored.ids[(p, o)]}")
            elif (p, o) in dead:
                continue
            elif spec.compact and (p, o) not in stored.ids:
                report.compacted_before_delivery += 1
            else:
                report.skipped += 1
                _note(report, report.skipped, f"{topic}[{p}] offset {o}: neither delivered nor dead-lettered")


def check_jobs(report: SoakReport, runs: list[dict[str, Any]], required: tuple[str, ...]) -> None:
    """Runs per job by outcome (a run's outcome is its worst table's), and rows each job removed."""
    rank = {"failed": 2, "ok": 1, "skipped": 0}
    outcome: dict[tuple[str, str], str] = {}
    for row in runs:
        key = (row["job"], row["run_id"])
        if rank.get(row["outcome"], 2) >= rank.get(outcome.get(key, "skipped"), 0):
            outcome[key] = row["outcome"]
        report.rows_removed[row["job"]] = report.rows_removed.get(row["job"], 0) + (row["rows_removed"] or 0)
    tally: dict[str, Counter[str]] = defaultdict(Counter)
    for (job, _), result in outcome.items():
        tally[job][result] += 1
    report.job_runs = {job: dict(c) for job, c in sorted(tally.items())}
    for job in required:
        if not report.job_runs.get(job, {}).get("ok"):
            report.jobs_without_success += 1
            report.problems.append(f"no {job} run succeeded")


def topic_table(layout: Layout, topic: str) -> str:
    """Where a topic's table is under the table root: its location (a topic the soak deletes and
    creates again gets a new one each time)."""
    return layout.topic_table(TopicStore(layout).get(topic))


def check_all(report: SoakReport, layout: Layout, topics: dict[str, TopicSpec], acks: list[dict[str, Any]],
              deliveries: list[dict[str, Any]], dead: dict[str, set[tuple[int, int]]]) -> None:
    by_topic: dict[str, dict[tuple[int, int], dict[str, Any]]] = defaultdict(dict)
    times = Counter((m["topic"], m["partition"], m["offset"]) for m in deliveries)
    for m in deliveries:
        by_topic[m["topic"]][(m["partition"], m["offset"])] = m
    report.acked = len(acks)
    report.delivered = len(times)
    report.delivered_more_than_once = sum(1 for n in times.values() if n > 1)
    for topic, spec in topics.items():
        stored = Stored.read(topic_table(layout, topic), spec.partitions)
        check_table(report, topic, spec, stored, [a for a in acks if a["topic"] == topic])
        if spec.retention and report.removed_by_retention == 0 and all(
                log.log_start == 0 for log in stored.logs.values()):
            report.retention_idle += 1
            report.problems.append(f"retention removed nothing from `{topic}`")
        if spec.subscribed:
            check_delivery(report, topic, spec, stored, by_topic[topic], dead.get(topic, set()))
    for count, what in ((report.lost, "acknowledged messages lost"), (report.skipped, "offsets skipped"),
                        (report.wrong_content, "deliveries of another message than stored")):
        if count > MAX_EXAMPLES:
            report.problems.append(f"{count} {what} in all")
    if report.retention_skips:
        report.problems.append(f"retention moved groups past {report.retention_skips} undelivered messages")


def check_nemesis(report: SoakReport) -> None:
    """Every fault kind the schedule drew was injected as often; after each SIGKILL or SIGSTOP of a
    node, each partition it owned answered a produce within the bound (the TTL, a heartbeat and the
    slack bench/soak/nemesis.py documents)."""
    short = {kind: (report.faults.get(kind, 0), drawn) for kind, drawn in report.faults_planned.items()
             if report.faults.get(kind, 0) < drawn}
    report.faults_missing = len(short)
    if short:
        report.problems.append("faults injected fewer times than drawn: " + ", ".join(
            f"{kind} {done} of {drawn}" for kind, (done, drawn) in sorted(short.items())))
    for o in report.outages:
        if o["seconds"] is None or o["seconds"] > report.outage_bound_s:
            report.outages_over_bound += 1
            took = "was not back" if o["seconds"] is None else f"was unavailable for {o['seconds']:.1f} s"
            _note(report, report.outages_over_bound,
                  f"{o['topic']}[{o['partition']}] {took} after a {o['fault']} of its owner {o['node']} "
                  f"(bound {report.outage_bound_s:g} s)"
                  + (f"; its last refusal, at {o['last_refusal']}" if o.get("last_refusal") else ""))
    if report.outages_over_bound > MAX_EXAMPLES:
        report.problems.append(f"{report.outages_over_bound} partitions over the outage bound in all")
