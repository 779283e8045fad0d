"""The soak on a cluster: three `serve` nodes sharing a table root on the local S3 server, one
SIGKILLed every period (the nemesis's faults in the long form), with the same load and the same
accounting as bench/scenarios/soak.py. `make soak-cluster` runs it."""

from __future__ import annotations

from pathlib import Path

from bench.result import Mode, Result, Scenario
from bench.scenarios.soak import KILL_EVERY_S, MINUTES
from bench.soak import run
from bench.soak.report import DELIVERY_RSS_MB, to_result

NODES = 3
# The nemesis's seed (bench/soak/nemesis.py) in `make soak-cluster` (the short form has no nemesis).
SEED = 38


def measure(mode: Mode, work: Path) -> Result:
    return to_result(run(MINUTES[mode], work, kill_every_s=KILL_EVERY_S[mode], seed=SEED, nodes=NODES))


SCENARIO = Scenario(
    name="soak_cluster", title="Soak on three nodes", measure=measure, in_make_bench=False, timeout_s=3600,
    setup=f"{NODES} `lakebroker serve` nodes, each with its own data dir and port, sharing one table root in a "
          "bucket of the local S3 server (MinIO, built by `make setup`; ingest lease TTL 8 s, heartbeat 1 s: "
          "serve's defaults), "
          "each with delivery off and the scheduler of the single-node soak (the job slots run each job once per "
          "interval across them); two `lakebroker deliver` workers; the single-node soak's topics, subscriptions "
          "and odd webhook receiver.",
    load="The single-node soak's producer process (keyed and keyless messages, each at `ack=table` or `ack=wal`, "
         "single, batch and Kafka REST v2), its requests spread over the nodes in turn and each retry sent to the "
         "next node, for 10 minutes, under a nemesis (bench/soak/nemesis.py): 30 fault slots whose order and "
         "victims are drawn from a seed (printed, and recorded in the result), each of the six kinds five times: "
         "**kill** (SIGKILL, then a restart on its data dir and port), **pause** (SIGSTOP for the TTL + 2 s, "
         "then SIGCONT), **clock** (a restart with the node's clock twice the TTL (16 s) ahead of or behind "
         "the storage's, by "
         "libfaketime, then one with its clock right), **leave** (SIGTERM, then it joins again), **move** "
         "(`lakebroker cluster move` of an `orders` partition to another node, back to its owner, then `--auto`) "
         "and **recreate** (the topic `churn` deleted and created again). Half a minute apart, a delivery worker "
         "is SIGKILLed; the cleanup_policy PATCHes and the silent clients as in the single-node soak. Then the "
         "other nodes stop gracefully (their partitions move to the first), delivery drains, the jobs run once "
         "more, and `lakebroker verify-replica` runs.",
    metric="As the single-node soak: every acknowledged message looked up in Delta; every offset of a subscribed "
           "topic in the receiver's records or the dead letters; the replica's verification; the delivery workers' "
           "peak RSS. And the faults injected of each kind; after each kill or pause, every partition the node "
           "owned is probed (a produce to it through another node, every 0.1 s) until acknowledged: its outage "
           "is the time from the signal to that answer; a node restarted with its clock off must hold no partition "
           "and set `lakebroker_clock_refused`.",
    target="Every `ack=table` message in Delta exactly once at its acknowledged offset; every `ack=wal` message "
           "exactly once, at its acknowledged offset or, acknowledged by a node that lost the partition before its "
           "commit, at another offset of its partition (docs/cluster.md#failover); offsets dense across every "
           "change of owner; every offset delivered or dead-lettered; no partition stalled; the replica verifies; "
           f"the delivery workers' peak RSS ≤ {DELIVERY_RSS_MB:,} MB; every fault kind injected as often as drawn; "
           "no partition unavailable longer than the TTL + a heartbeat + 4 s of slack (13 s) after its owner was "
           "killed or paused; every node restarted with its clock off held no partition.",
)
