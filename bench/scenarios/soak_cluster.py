"""The soak on a cluster: three `serve` nodes sharing a table root, one SIGKILLed every period, the
same load and the same accounting as bench/scenarios/soak.py. `make soak-cluster` runs it."""

from __future__ import annotations

from pathlib import Path

from bench.result import Mode, Result, Scenario
from bench.scenarios.soak import KILL_EVERY_S, MINUTES
from bench.soak import run
from bench.soak.report import DELIVERY_RSS_MB, to_result

NODES = 3


def measure(mode: Mode, work: Path) -> Result:
    return to_result(run(MINUTES[mode], work, kill_every_s=KILL_EVERY_S[mode], nodes=NODES))


SCENARIO = Scenario(
    name="soak_cluster", title="Soak on three nodes", measure=measure, in_make_bench=False, timeout_s=3600,
    setup=f"{NODES} `lakebroker serve` nodes, each with its own data dir and port, sharing one table root (ingest "
          "lease TTL 4 s), each with delivery off and the scheduler of the single-node soak (the job slots run each "
          "job once per interval across them); two `lakebroker deliver` workers; the single-node soak's topics, "
          "subscriptions and odd webhook receiver.",
    load="The single-node soak's producer process, its requests spread over the nodes in turn and each retry sent "
         "to the next node, for 10 minutes. Every 60 s one node is SIGKILLed and restarted on its data dir and "
         "port (each node in turn), and half a period later one worker; the topic re-creates, the cleanup_policy "
         "PATCHes and the silent clients as in the single-node soak. Then the other nodes stop gracefully (their "
         "partitions move to the first), delivery drains, the jobs run once more, and `lakebroker verify-replica` "
         "runs.",
    metric="As the single-node soak: every acknowledged message looked up in Delta; every offset of a subscribed "
           "topic in the receiver's records or the dead letters; the replica's verification; the delivery workers' "
           "peak RSS.",
    target="As the single-node soak: every acknowledged message in Delta exactly once at its acknowledged offset "
           "(or, acknowledged at ack=wal by a node that lost the partition before its commit, at another offset of "
           "its partition: docs/cluster.md#failover), with dense offsets across every change of owner; every "
           "offset delivered or dead-lettered; no partition "
           f"stalled; the replica verifies; the delivery workers' peak RSS ≤ {DELIVERY_RSS_MB:,} MB.",
)
