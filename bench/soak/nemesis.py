"""The cluster soak's nemesis: a schedule of faults drawn from a seed, and what each fault does.

`schedule(seed, slots)` gives every kind `slots // len(Fault)` slots (the rest drawn at random) in
an order drawn from `random.Random(seed)`: the seed is printed and recorded in the result, so a run
can be repeated fault for fault. At each slot the soak (bench/soak/__init__.py) calls
`Nemesis.inject`, which does one fault to one node (also drawn from the seed, never the last fault's)
and returns once the cluster is whole again:

* `kill`: SIGKILL, then the node starts again on its data dir and port;
* `pause`: SIGSTOP for longer than the ingest lease TTL, then SIGCONT: its leases run out while it
  is stopped, and the node, woken, finds its partitions taken (its late commits are fenced);
* `clock`: the node restarts (SIGTERM) with its clock off the storage's by more than a quarter of
  the TTL (libfaketime, ahead or behind), must take no partition and hold none (docs/cluster.md#limits),
  then restarts with its clock right;
* `leave`: SIGTERM (a graceful leave: it hands its partitions over), then it joins again;
* `move`: `lakebroker cluster move` of a partition of `orders` to another node under load, back to
  its owner, then `--auto`: each move must be seen in GET /v1/cluster within `MOVE_WAIT_S`;
* `recreate`: the topic `churn` deleted and created again (the soak's own `_recreate`).

After a `kill` or a `pause`, every partition the node owned is probed (bench/soak/probe.py) until a
produce to it through another node is acknowledged: the time from the signal to that answer is
the partition's outage, which the checks bound by the TTL plus a heartbeat plus `OUTAGE_SLACK_S`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import httpx

from bench.harness.servers import wait_for
from bench.result import REPO
from bench.soak.probe import Probes
from tests.servers import LIBFAKETIME, clock_off_env

if TYPE_CHECKING:
    from bench.soak import Soak
    from tests.servers import ServerProcess

MOVE_WAIT_S = 20.0  # a hand-over takes a second or two (docs/cluster.md); a loaded 2-core machine, more
CLOCK_WAIT_S = 25.0  # a node checks its clock at its first heartbeat, then every 10 s
# What a partition's outage after its owner's death may exceed TTL + heartbeat by: the new owner's
# claim (a commit to the topic table and one to the ownership table) and the opening of the
# partition (the ids other nodes committed to it, read from the table) on a 2-core machine that
# also runs the load, two delivery workers and the scheduled Spark jobs; and the probe's own step.
OUTAGE_SLACK_S = 4.0


class Fault(StrEnum):
    KILL = "kill"
    PAUSE = "pause"
    CLOCK = "clock"
    LEAVE = "leave"
    MOVE = "move"
    RECREATE = "recreate"


def schedule(seed: int, slots: int) -> list[Fault]:
    """`slots` faults: each kind `slots // len(Fault)` times, the remainder drawn, all in a seeded order."""
    rng = random.Random(seed)
    kinds = list(Fault)
    picks = [kind for kind in kinds for _ in range(slots // len(kinds))]
    picks += [rng.choice(kinds) for _ in range(slots - len(picks))]
    rng.shuffle(picks)
    return picks


class Nemesis:
    def __init__(self, soak: Soak, seed: int, ttl_s: float, heartbeat_s: float) -> None:
        self.soak, self.ttl_s, self.heartbeat_s = soak, ttl_s, heartbeat_s
        self.rng = random.Random(seed + 1)  # the victims and the clock offsets; `schedule` draws the order
        self.injected: Counter[str] = Counter()
        self.outages: list[dict[str, Any]] = []  # one per partition a killed or paused node owned
        self.probes = Probes(soak.work / "probe-acks.jsonl")
        self.log: list[str] = []  # one line per fault: when, what, which node
        self._last: ServerProcess | None = None  # the last fault's node: the next is another

    @property
    def bound_s(self) -> float:
        return self.ttl_s + self.heartbeat_s + OUTAGE_SLACK_S

    def inject(self, fault: Fault) -> None:
        victim = self.rng.choice([s for s in self.soak.servers if s is not self._last] or self.soak.servers)
        self._last = victim
        began = time.monotonic()
        getattr(self, f"_{fault.value}")(victim)
        self.injected[fault.value] += 1
        self.log.append(f"{time.strftime('%H:%M:%S')} {fault.value} {victim.url} ({time.monotonic() - began:.1f} s)")
        print(f"[soak] nemesis: {self.log[-1]}", file=sys.stderr, flush=True)

    # --- the faults ---

    def _kill(self, victim: ServerProcess) -> None:
        owned = self._owned_by(victim)
        others = [s.url for s in self.soak.servers if s is not victim]
        at = time.monotonic()
        self.soak.kill_and_restart(victim, probe=lambda: self.probes.start(owned, others, at))
        self._note_outages("kill", victim, self.probes.wait(at + self.bound_s + 60))

    def _pause(self, victim: ServerProcess) -> None:
        assert victim.proc is not None
        owned = self._owned_by(victim)
        others = [s.url for s in self.soak.servers if s is not victim]
        victim.proc.send_signal(signal.SIGSTOP)
        at = time.monotonic()
        try:
            self.probes.start(owned, others, at)
            time.sleep(self.ttl_s + 2.0)  # longer than the TTL: its leases run out while it is stopped
        finally:
            victim.proc.send_signal(signal.SIGCONT)
        self._note_outages("pause", victim, self.probes.wait(at + self.bound_s + 60))

    def _clock(self, victim: ServerProcess) -> None:
        if not LIBFAKETIME:
            self.soak.report.problems.append("libfaketime is not installed: no clock fault injected")
            return
        offset = self.rng.choice((-1, 1)) * round(2 * self.ttl_s)  # far past the quarter TTL the leases tolerate
        saved = dict(victim.env)
        self.soak.stop_node(victim)
        # No scheduled Spark jobs on the node with the clock off: their JVMs would run with it too.
        victim.env.update({**clock_off_env(offset),
                           **{f"LAKEBROKER_{job}_INTERVAL_S": "0"
                              for job in ("COMPACTION", "RETENTION", "KEY_COMPACTION", "REPLICATION")}})
        try:
            victim.start(timeout=120)

            def refused() -> bool:
                node = self._node_id(victim)
                cluster = self._cluster(victim.url)
                return (cluster is not None and _metric(victim.url, "lakebroker_clock_refused") == 1
                        and not any(p["owner"] == node for p in cluster["partitions"]))

            if wait_for(refused, CLOCK_WAIT_S, step=0.25):
                self.soak.report.clock_refusals += 1
            else:
                self.soak.report.problems.append(
                    f"{victim.url}, its clock {offset:+d} s off, still held partitions or did not say it refuses "
                    f"them {CLOCK_WAIT_S:.0f} s after its start")
        finally:
            victim.stop()
            victim.env.clear()
            victim.env.update(saved)
            victim.start(timeout=120)

    def _leave(self, victim: ServerProcess) -> None:
        self.soak.stop_node(victim)
        time.sleep(2 * self.heartbeat_s)  # the others take its partitions
        victim.start(timeout=120)

    def _move(self, victim: ServerProcess) -> None:
        """A partition of `orders` to `victim` (or, if it owns it, to another node), back, then to the plan."""
        cluster = self._cluster(self.soak.servers[0].url)
        if cluster is None:
            self.soak.report.problems.append("move: GET /v1/cluster did not answer")
            return
        partition = self.rng.randrange(4)
        owner = next(p["owner"] for p in cluster["partitions"] if (p["topic"], p["partition"]) == ("orders", partition))
        live = sorted(n["id"] for n in cluster["nodes"] if n["alive"] and not n["draining"])
        target = self._node_id(victim)
        if target == owner or target not in live:
            target = self.rng.choice([n for n in live if n != owner] or live)
        for to in (target, owner):
            if to is None:
                continue
            self._cli_move("orders", partition, ["--to", to])
            def moved(to: str = to) -> bool:
                return self._owner_of("orders", partition) == to

            if not wait_for(moved, MOVE_WAIT_S, step=0.25):
                self.soak.report.problems.append(f"move: orders[{partition}] was not on {to} within "
                                                 f"{MOVE_WAIT_S:.0f} s of `lakebroker cluster move`")
            else:
                self.soak.report.moves += 1
        self._cli_move("orders", partition, ["--auto"])

    def _recreate(self, victim: ServerProcess) -> None:
        self.soak.recreate()

    # --- helpers ---

    def _cli_move(self, topic: str, partition: int, how: list[str]) -> None:
        proc = subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(self.soak.work / "cli"), "cluster",
                               "move", topic, str(partition), *how], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env={**os.environ, **self.soak.shared})
        if proc.returncode != 0:
            self.soak.report.problems.append(f"lakebroker cluster move {topic} {partition} {' '.join(how)}: "
                                             f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-500:]}")

    def _cluster(self, url: str) -> dict[str, Any] | None:
        try:
            r = httpx.get(f"{url}/v1/cluster", timeout=10)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None  # type: ignore[no-any-return]

    def _owner_of(self, topic: str, partition: int) -> str | None:
        for server in self.soak.servers:
            cluster = self._cluster(server.url)
            if cluster is not None:
                return next((p["owner"] for p in cluster["partitions"]
                             if (p["topic"], p["partition"]) == (topic, partition)), None)
        return None

    @staticmethod
    def _node_id(server: ServerProcess) -> str:
        node: str = (server.data_dir / "node_id").read_text().strip()
        return node

    def _owned_by(self, victim: ServerProcess) -> list[tuple[str, int]]:
        """The partitions `victim` owns, as another node sees them (`churn` aside: it is re-created)."""
        node = self._node_id(victim)
        for server in self.soak.servers:
            if server is not victim and (cluster := self._cluster(server.url)) is not None:
                return [(p["topic"], p["partition"]) for p in cluster["partitions"]
                        if p["owner"] == node and p["topic"] != "churn"]
        return []

    def _note_outages(self, fault: str, victim: ServerProcess, outages: dict[tuple[str, int], float | None]) -> None:
        for (topic, partition), seconds in sorted(outages.items()):
            self.outages.append({"fault": fault, "node": victim.url, "topic": topic, "partition": partition,
                                 "seconds": None if seconds is None else round(seconds, 2),
                                 "last_refusal": self.probes.refused.get((topic, partition))})


def _metric(url: str, name: str) -> float | None:
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


