"""The soak: every feature at once under faults for a bounded time, then every message accounted for.

The soak itself is bench/soak/ (its design in bench/soak/__init__.py). `make soak` runs it, not `make bench`:
ten minutes of load take about half an hour with the Spark jobs and the drain.
"""

from __future__ import annotations

from pathlib import Path

from bench.result import Mode, Result, Scenario
from bench.soak import run
from bench.soak.report import DELIVERY_RSS_MB, to_result

MINUTES = {"full": 10.0, "quick": 1.0, "tiny": 1.0}  # quick and tiny: the short form tests/bench/test_soak.py runs
KILL_EVERY_S = {"full": 60.0, "quick": 20.0, "tiny": 20.0}


def measure(mode: Mode, work: Path) -> Result:
    return to_result(run(MINUTES[mode], work, kill_every_s=KILL_EVERY_S[mode]))


SCENARIO = Scenario(
    name="soak", title="Soak", measure=measure, in_make_bench=False, timeout_s=3600,
    setup="`lakebroker serve` with delivery off, its scheduler running compaction, retention, key compaction and "
          "replication (to a second directory) every 15-30 s, and two `lakebroker deliver` workers; five topics: "
          "`orders`, `events` (retention 60 s), `profiles` (key-compacted), `churn` (no subscription) and `big`; a "
          "webhook receiver on loopback that fails 30 % of requests (429, 500, 503) with odd headers (`Retry-After: "
          "²`, a huge or garbage Retry-After, a past date, non-ASCII and 6 kB values) and answers slowly at times.",
    load="A producer process sends single, batch and Kafka REST v2 produce (about 85 msg/s offered) for 10 minutes and "
         "records every acknowledgement; `big` gets messages of just under 1 MiB, its subscription paused for half "
         "the load. Every 60 s serve is SIGKILLed and restarted, and half a period later one worker; `churn` is "
         "deleted and re-created every 45 s; `profiles` is PATCHed to `cleanup_policy=delete` at 40 % of the load "
         "and back at 60 %; 40 clients go silent after an early 404. Then delivery drains, the jobs run once more, "
         "and `lakebroker verify-replica` runs.",
    metric="Every acknowledged message looked up in Delta; every offset of a subscribed topic in the receiver's "
           "records or the dead letters; the subscriptions' lag after the drain; the replica's verification; the "
           "delivery workers' peak RSS (VmHWM).",
    target="Every acknowledged message in Delta exactly once at its acknowledged offset, with dense offsets (below a "
           "log start only retention, on `profiles` only superseded keys); every offset delivered or dead-lettered, "
           "no retention skip; no partition stalled; the replica verifies; each silent client closed by the server "
           f"within 15 s; the delivery workers' peak RSS ≤ {DELIVERY_RSS_MB:,} MB.",
)
