"""The soak's report: the counts of one run and its violations, and their markdown for docs/benchmarks.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

ABOUT = ("`lakebroker serve` (delivery off; its scheduler running compaction, retention, key compaction and "
         "replication every few seconds, replicating to a second directory) and two `lakebroker deliver` workers "
         "take single, batch and REST v2 produce on five topics from a separate producer process, which records "
         "every acknowledgement (one topic gets messages of just under 1 MiB, and its subscription is paused for "
         "half the load). Serve and a worker are SIGKILLed every kill period (60 s for `make soak`), the "
         "topic `churn` is deleted and re-created, and the webhook receiver fails 30 % of requests (429, 500, 503) "
         "with odd headers (`Retry-After: ²`, a huge or garbage Retry-After, a past date, non-ASCII and 6 kB "
         "values) and answers slowly at times. Once the load stops and delivery drains, every acknowledged message "
         "is looked up in Delta, every offset in the receiver's records or the dead letters, and the replica is "
         "checked with `lakebroker verify-replica`; `bench/soak.py` says what each check allows.")
REMOVERS = ("retention", "key-compaction")  # the jobs whose rows_removed are rows gone from a topic


@dataclass
class SoakReport:
    minutes: float
    seconds: float = 0.0
    acked: int = 0
    in_delta: int = 0
    duplicates: int = 0  # ids stored more than once
    gaps: int = 0  # partitions whose offsets are not dense from log start to log end
    lost: int = 0  # acknowledged, above the log start, not in the table at their offset
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
    serve_kills: int = 0
    worker_kills: int = 0
    recreates: int = 0
    policy_patches: int = 0  # cleanup_policy PATCHes of `profiles` under load
    mixed_wal_restarts: int = 0  # restarts of serve whose WAL held batch chunks and singles of one partition
    silent_clients: list[float | None] = field(default_factory=list)  # s until the server closed each; None: open
    delivery_peak_rss_mb: float = 0.0  # the largest peak RSS of a delivery worker process
    receiver_answers: dict[str, int] = field(default_factory=dict)
    producer: dict[str, int] = field(default_factory=dict)
    job_starts: dict[str, int] = field(default_factory=dict)  # job -> runs the scheduler started
    job_runs: dict[str, dict[str, int]] = field(default_factory=dict)  # job -> outcome -> runs recorded
    rows_removed: dict[str, int] = field(default_factory=dict)  # job -> rows removed in all
    replica_verified: bool = False
    replica_output: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def markdown(self, command: str) -> str:
        jobs = "; ".join(f"{job}: {self.job_starts.get(job, 0)} started, " + (", ".join(
            f"{n} {o}" for o, n in sorted(self.job_runs.get(job, {}).items())) or "none ended")
            + (f" ({self.rows_removed[job]:,} rows removed)" if job in REMOVERS and self.rows_removed.get(job) else "")
            for job in sorted({*self.job_starts, *self.job_runs}))
        rows = [
            ("messages acknowledged", f"{self.acked:,}"),
            ("rows in Delta (checked topics, at the end)", f"{self.in_delta:,}"),
            ("duplicates in Delta", f"**{self.duplicates}**"),
            ("partitions with offset gaps", f"**{self.gaps}**"),
            ("acknowledged and lost", f"**{self.lost}**"),
            ("removed by retention (after delivery) / by key compaction", f"{self.removed_by_retention:,} / "
             f"{self.compacted_away:,}"),
            ("offsets to deliver", f"{self.expected_deliveries:,}"),
            ("delivered / of them more than once", f"{self.delivered:,} / {self.delivered_more_than_once:,}"),
            ("dead-lettered", f"{self.dead_lettered:,}"),
            ("compacted away before delivery (`profiles`)", f"{self.compacted_before_delivery:,}"),
            ("skipped (neither delivered nor dead-lettered)", f"**{self.skipped}**"),
            ("retention skips", f"**{self.retention_skips}**"),
            ("deliveries whose body differs from the table", f"**{self.wrong_content}**"),
            ("SIGKILLs of serve / of a worker", f"{self.serve_kills} / {self.worker_kills}"),
            ("topic re-creates", f"{self.recreates}"),
            ("cleanup_policy PATCHes of `profiles` under load (compact → delete → compact)", f"{self.policy_patches}"),
            ("restarts of serve whose WAL held batch chunks and singles of one partition",
             f"{self.mixed_wal_restarts} of {self.serve_kills}"),
            ("silent clients after an early answer closed by the server / slowest",
             f"{sum(t is not None for t in self.silent_clients)} of {len(self.silent_clients)} / "
             + (f"{max(t for t in self.silent_clients if t is not None):.1f} s"
                if any(t is not None for t in self.silent_clients) else "none")),
            ("delivery worker peak RSS (1 MiB messages to a lagging subscription)",
             f"{self.delivery_peak_rss_mb:.0f} MB"),
            ("job runs (scheduler; a run cut short by a SIGKILL of serve records no outcome)", jobs or "none"),
            ("replica verified", "yes" if self.replica_verified else "**no**"),
            ("receiver answers", ", ".join(f"{k}: {v:,}" for k, v in sorted(self.receiver_answers.items()))),
            ("producer", ", ".join(f"{k}: {v:,}" for k, v in sorted(self.producer.items()))),
        ]
        lines = ["# Soak", "",
                 f"Command: `{command}`; ran {self.seconds / 60:.1f} minutes in all on {datetime.now(UTC):%Y-%m-%d} "
                 f"({self.minutes:g} minutes of load). {ABOUT}", "",
                 "| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), "",
                 f"Result: **{'all invariants hold' if self.ok else 'FAILED'}**."]
        lines += [f"- {p}" for p in self.problems[:20]]
        return "\n".join(lines) + "\n"
