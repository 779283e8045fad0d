"""The soak: everything at once, with faults, for a bounded time; then every message is accounted for.

`make soak` (`python -m bench.soak --minutes 10`, bench/soak/__main__.py) writes bench/results/soak.json
and re-renders docs/benchmarks.md; bench/scenarios/soak.py declares it, and tests/bench/test_soak.py runs
a short form. This module runs the processes and the faults; bench/soak/checks.py holds the checks,
bench/soak/report.py turns the counts into a Result, each invariant a Check. One run:

* producers in their own process (bench/soak/producer.py): single, batch and Kafka REST v2 produce
  to four topics, recording every acknowledged (topic, partition, offset, id);
* `lakebroker serve` with delivery off and its scheduler running compaction, retention, key
  compaction and replication on short intervals (the order rotates at each restart, so every job
  gets its turn between kills), and two `lakebroker deliver` workers;
* a webhook receiver on loopback that fails 30 % of requests, with odd headers, and is slow at times;
* every `kill_every_s`: SIGKILL of serve (then restarted), and half a period later SIGKILL of one
  worker (then restarted); every `recreate_every_s`: the topic `churn` deleted and created again.
  On a cluster (`nodes` > 1) of three minutes or more, the nemesis (bench/soak/nemesis.py) replaces
  the SIGKILLs of serve and the re-creates: `plan.fault_slots` faults drawn from the seed (SIGKILL,
  SIGSTOP past the lease TTL, a clock off, a leave and join, a partition moved back and forth,
  `churn` re-created), each run to its end, and after each SIGKILL or SIGSTOP each partition of the
  node is probed until it answers;
* `big` gets messages of just under 1 MiB, and its subscription lags: paused until half the load
  is done, so the delivery workers then catch up through large rows (their peak RSS is reported);
* `profiles` (compact) is PATCHed to `cleanup_policy=delete` at 40 % of the load and back at 60 %;
* after the first restart of serve, clients that get an early answer (404 from the request head)
  and then go silent, half with their body sent whole and half with part of it: the server must
  close each within its timeouts;
* before each restart of serve, its WAL is read (`Wal.inspect`): restarts whose WAL held batch
  chunks and single records of one partition are counted.

Then the load stops, serve restarts gracefully with its schedule off while delivery drains (the
jobs had their turns under load; on two cores their JVMs would only slow the drain), the workers
stop, serve restarts gracefully with retention,
key compaction and replication first in its schedule, and once replication has run past all of it,
serve stops and `lakebroker verify-replica` runs. The checks (each violation also a sentence in
`SoakReport.problems`):

* every acknowledged message is in its topic's table exactly once at its acknowledged offset, and
  offsets are dense from each partition's log start to its log end; below the log start, rows are
  gone by retention (allowed on `events` only), and on the key-compacted `profiles` an acknowledged
  message may be missing only if a later row with its key is stored (so the latest value of every
  key is there);
* every offset of a subscribed topic is delivered at least once or dead-lettered, with no
  retention skip (retention_ms is far above the delivery lag, so retention only removes delivered
  messages); on `profiles`, offsets compacted away before delivery are counted apart;
* delivery drained: no subscription partition is left with lag or sends in flight;
* retention removed something, key compaction ran, and the replica verifies;
* the load did what it is for: a restart recovered batch chunks and singles of one partition, both
  cleanup_policy PATCHes ran, every silent client was closed by the server;
* the delivery workers' peak RSS stays under `report.DELIVERY_RSS_MB`.
Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.harness.memory import peak_rss_mb
from bench.harness.servers import BenchError, wait_for
from bench.result import REPO
from bench.scenarios.s3 import ACCESS_KEY, SECRET_KEY
from bench.soak.checks import TopicSpec, check_all, check_jobs, check_nemesis, topic_table
from bench.soak.nemesis import Fault, Nemesis, schedule
from bench.soak.report import SoakReport
from lakebroker.ingest_api.router import STRANDED
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from scripts.s3_process import S3Process
from scripts.s3_process import start as start_s3
from tests.receivers import Receiver
from tests.servers import ServerProcess, free_port

# `events` keeps messages for the plan's retention_ms, the others forever; `profiles` is key-compacted;
# `churn` is deleted and re-created, with no subscription.
SPECS = {"orders": TopicSpec(4, subscribed=True), "events": TopicSpec(3, retention=True, subscribed=True),
         "profiles": TopicSpec(2, compact=True, subscribed=True), "churn": TopicSpec(2),
         "big": TopicSpec(1, subscribed=True)}
SUBSCRIBED = {"orders": {"ordering": "partition", "batch_size": 10},
              "events": {"ordering": "none", "batch_size": 10},
              "profiles": {"ordering": "key", "batch_size": 5},
              "big": {"ordering": "partition", "batch_size": 1}}
SILENT_CLIENTS = 20  # of each kind: body sent whole, body sent in part
SILENT_CLOSE_S = 15.0  # within this the server must have closed each (its timeouts: 5 s keep-alive, 5 s body)
RECREATE_SEEN_S = 10.0  # the longest a node may take to serve a re-created topic (docs/cluster.md: a heartbeat)
# What a node that stops logs when acknowledged messages it holds for other nodes' partitions stay
# in its WAL, without the count.
STRANDED_LOG = STRANDED.split("%d", 1)[1].encode()
JOBS = ("compaction", "retention", "key-compaction", "replication")
# The nemesis's leases are serve's defaults (8 s, 1 s): the outage bound it checks is the one users
# get. The short form, which has no nemesis, keeps short ones, so its stops' hand-overs (and the
# forwards of what they resend, which wait up to a TTL) end quickly beside the whole suite.
CLUSTER = {"LAKEBROKER_INGEST_LEASE_TTL_S": "8", "LAKEBROKER_INGEST_HEARTBEAT_S": "1"}
QUICK_CLUSTER = {"LAKEBROKER_INGEST_LEASE_TTL_S": "4", "LAKEBROKER_INGEST_HEARTBEAT_S": "0.5"}
FAST = {"LAKEBROKER_LEASE_TTL_S": "3", "LAKEBROKER_HEARTBEAT_S": "0.5", "LAKEBROKER_OFFSET_COMMIT_INTERVAL_MS": "200",
        "LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1", "LAKEBROKER_FLUSH_INTERVAL_MS": "100",
        "LAKEBROKER_BODY_READ_TIMEOUT_S": "5"}


@dataclass
class SoakPlan:
    """What one run does; `for_minutes` scales it."""

    minutes: float
    kill_every_s: float
    recreate_every_s: float
    job_interval_s: tuple[int, ...]  # one per JOBS entry, rotated at each serve restart
    retention_ms: int
    max_messages: int
    drain_timeout_s: float
    jobs_timeout_s: float
    # The short form's retention window (20 s) is shorter than delivery's lag can be when it runs
    # beside the whole test suite: there retention runs only once delivery has drained.
    retention_during_load: bool = True
    # A cluster's nemesis (bench/soak/nemesis.py): faults in the load, each kind slots // 6 times. None in
    # the short form: its one SIGKILL made the check of a restart's WAL (batch chunks and singles of one
    # partition) a matter of chance (two runs of three failed it), so it keeps its SIGKILLs every period.
    fault_slots: int = 0

    @classmethod
    def for_minutes(cls, minutes: float, kill_every_s: float = 60.0) -> SoakPlan:
        short = minutes < 3
        return cls(minutes=minutes, kill_every_s=kill_every_s, recreate_every_s=kill_every_s * 0.75,
                   job_interval_s=(3, 4, 5, 6) if short else (15, 20, 25, 30),
                   retention_ms=20_000 if short else 60_000, max_messages=int(minutes * 60 * 150),
                   drain_timeout_s=300 if short else 600, jobs_timeout_s=1500, retention_during_load=not short,
                   fault_slots=0 if short else max(len(Fault), int(minutes * 3)))


def odd_receiver(seed: int) -> Receiver:
    """30 % failures with odd headers, some slow answers (within the subscriptions' 3 s timeout)."""
    rng = random.Random(seed)
    lock = threading.Lock()
    failures: list[tuple[int, dict[str, str]]] = [
        (500, {"Retry-After": "99999999999"}),  # huge, and on a 500, where it does not count
        (503, {"Retry-After": "\u00b2"}),  # a Unicode digit: not delta-seconds
        (429, {"Retry-After": "1"}),
        (429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),  # a date in the past: no wait
        (503, {"Retry-After": "soon", "X-Garbage": "\u00ff\u00fe\u00e9 \t;;=="}),
        (500, {"Content-Type": "text/\u00e9\u00e9", "X-Long": "x" * 6000}),
    ]

    def behave(n: int, body: Any) -> tuple[int, dict[str, str], float]:
        with lock:
            roll, slow, pick = rng.random(), rng.random(), rng.randrange(len(failures))
        delay = 0.5 + slow if slow < 0.04 else 0.0
        if roll < 0.30:
            status, headers = failures[pick]
            return status, headers, delay
        return 200, ({"Retry-After": "3600", "X-Odd": "\u00b2"} if roll > 0.97 else {}), delay

    return Receiver(behave)


def start_worker(data: Path, name: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "deliver",
                                 "--worker-id", name], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **FAST, **env}, cwd=REPO)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


class Soak:
    def __init__(self, plan: SoakPlan, work: Path, seed: int = 12, nodes: int = 1) -> None:
        self.plan, self.work, self.seed = plan, work, seed
        self.data = work / "data"
        # One node keeps its tables in its data dir; a cluster's nodes share a table root on the
        # local S3 server, as nodes on several machines share a bucket.
        self.s3: S3Process | None = None
        self.shared: dict[str, str] = {}
        if nodes > 1:
            self.s3 = start_s3(work / "minio", ACCESS_KEY, SECRET_KEY)
            os.environ.update(self.s3.env)  # the checks read the tables from this process
            leases = CLUSTER if plan.fault_slots else QUICK_CLUSTER
            self.shared = {"LAKEBROKER_TABLES_URI": self.s3.uri("soak"), **self.s3.env, **leases}
        self.replica = work / "replica"
        self.report = SoakReport(minutes=plan.minutes, nodes=nodes)
        self.nemesis: Nemesis | None = None
        if nodes > 1 and plan.fault_slots:
            self.report.seed = seed
            self.report.fault_schedule = [f.value for f in schedule(seed, plan.fault_slots)]
            self.report.faults_planned = dict(sorted(Counter(self.report.fault_schedule).items()))
            self.nemesis = Nemesis(self, seed, float(CLUSTER["LAKEBROKER_INGEST_LEASE_TTL_S"]),
                                   float(CLUSTER["LAKEBROKER_INGEST_HEARTBEAT_S"]))
            print(f"[soak] nemesis seed {seed}: " + " ".join(self.report.fault_schedule), file=sys.stderr, flush=True)
        self.receiver = odd_receiver(seed)
        self.receiver.server.handle_error = lambda *args: None  # type: ignore[method-assign]  # broken pipes
        self.servers = [ServerProcess(self.data if i == 0 else work / f"node-{i}", env=self._server_env(0),
                                      port=free_port()) for i in range(nodes)]
        self.server = self.servers[0]  # takes the admin calls, and alone serves the drain
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.acks_file = work / "acks.jsonl"
        self.churn_since = 0.0  # time.time() when the current `churn` topic was created
        self._dead: dict[str, set[tuple[int, int]]] = {}  # topic -> dead-lettered (partition, offset)
        self._silent: threading.Thread | None = None

    def _server_env(self, rotation: int, drain: bool = False, jobs: bool = True) -> dict[str, str]:
        intervals = self.plan.job_interval_s[rotation % len(JOBS):] + self.plan.job_interval_s[:rotation % len(JOBS)]
        names = ("COMPACTION", "RETENTION", "KEY_COMPACTION", "REPLICATION")
        if not jobs:
            intervals = (0, 0, 0, 0)  # 0: the scheduler runs no such job
        elif drain:  # retention first, then key compaction, replication, and compaction in a long run
            intervals = (4 if self._need_compaction else 3600, 1, 2, 3)
        elif not self.plan.retention_during_load:
            intervals = (intervals[0], 3600, *intervals[2:])
        env = {**FAST, **self.shared, "LAKEBROKER_DELIVER_IN_SERVE": "0",
               "LAKEBROKER_REPLICATION_URI": str(self.replica), "LAKEBROKER_OFFSETS_COMPACTION_INTERVAL_S": "0",
               "LAKEBROKER_KEY_COMPACTION_MIN_LAG_MS": "2000",
               "LAKEBROKER_COMPACTION_TARGET_FILE_BYTES": "65536", "LAKEBROKER_JOB_TIMEOUT_S": "1200"}
        for name, seconds in zip(names, intervals, strict=True):
            env[f"LAKEBROKER_{name}_INTERVAL_S"] = str(seconds)
        return env

    # --- the run ---

    def run(self) -> SoakReport:
        started = time.monotonic()
        try:
            urls = [server.start(timeout=90) for server in self.servers]
            self._setup(urls[0])
            for name in ("worker-a", "worker-b"):
                self.workers[name] = self._start_worker(name)
            self._load(urls)
            self._drain(urls[0])
        finally:
            for proc in self.workers.values():
                stop_process(proc)
            for server in self.servers:
                server.stop()
            self.receiver.close()
            self._keep_evidence()
        try:
            self._verify_replica()
            self._check()
        finally:
            if self.s3 is not None:
                self.s3.stop()
        self.report.seconds = time.monotonic() - started
        return self.report

    def _start_worker(self, name: str) -> subprocess.Popen[bytes]:
        return start_worker(self.data, name, self.work / f"{name}.log", self.shared)

    def _setup(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            for name in SPECS:
                r = client.post("/v1/topics", json=self._topic(name))
                if r.status_code != 201:
                    raise BenchError(f"creating {name}: {r.status_code} {r.text}")
            self.churn_since = time.time()
            for topic, options in SUBSCRIBED.items():
                r = client.post("/v1/subscriptions", json={
                    "name": f"{topic}-hooks", "topic": topic, "url": self.receiver.url, "start": "earliest",
                    "max_attempts": 4, "retry_schedule_s": [0.05, 0.2, 0.5], "timeout_s": 3.0, **options})
                if r.status_code != 201:
                    raise BenchError(f"subscribing to {topic}: {r.status_code} {r.text}")
            r = client.post("/v1/subscriptions/big-hooks/pause")
            if r.status_code != 200:
                raise BenchError(f"pausing big-hooks: {r.status_code} {r.text}")

    def _topic(self, name: str) -> dict[str, Any]:
        spec = SPECS[name]
        return {"name": name, "partitions": spec.partitions, "retention_ms": self.plan.retention_ms if spec.retention
                else None, "cleanup_policy": "compact" if spec.compact else "delete"}

    def _load(self, urls: list[str]) -> None:
        seconds = self.plan.minutes * 60
        producer = subprocess.Popen(
            [sys.executable, "-m", "bench.soak.producer", *(f"--url={url}" for url in urls), "--seconds", str(seconds),
             "--max-messages",
             str(self.plan.max_messages), "--out", str(self.acks_file), "--seed", str(self.seed)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=(self.work / "producer.log").open("ab"))
        begin = time.monotonic()
        every = self.plan.kill_every_s
        events: list[tuple[float, str, Any]] = [
            (begin + every * (k + 1), "worker", self._worker) for k in range(int(seconds / every))]
        events += [(begin + seconds * 0.4, "to_delete", self._to_delete),
                   (begin + seconds * 0.5, "resume_big", self._resume_big),
                   (begin + seconds * 0.6, "to_compact", self._to_compact)]
        if self.nemesis is None:  # one node: SIGKILLs of serve, and `churn` re-created, at fixed periods
            events += [(begin + every * (k + 0.5), "serve", self._serve) for k in range(int(seconds / every))]
            events += [(begin + self.plan.recreate_every_s * (k + 1), "recreate", self.recreate)
                       for k in range(int(seconds / self.plan.recreate_every_s))]
        else:  # a cluster: the nemesis's faults at its slots, each run to its end even past the load's
            nemesis = self.nemesis
            step = (seconds - 3) / len(self.report.fault_schedule)
            events += [(begin + step * (k + 0.5), "fault", lambda f=Fault(fault): nemesis.inject(f))
                       for k, fault in enumerate(self.report.fault_schedule)]
        try:
            for at, what, do in sorted(events, key=lambda e: e[0]):
                if at > begin + seconds - 3 and what != "fault":
                    continue  # leave the end of the load undisturbed
                time.sleep(max(0.0, at - time.monotonic()))
                do()
            out, _ = producer.communicate(timeout=seconds + 120)
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()
            if self.nemesis is not None:
                self._note_nemesis(self.nemesis, time.monotonic() - begin > seconds)
        self.report.producer = orjson.loads(out.strip().splitlines()[-1])

    def _note_nemesis(self, nemesis: Nemesis, past_load: bool) -> None:
        self.report.faults = {f.value: nemesis.injected.get(f.value, 0) for f in Fault}
        self.report.outages = nemesis.outages
        self.report.outage_bound_s = nemesis.bound_s
        self.report.nemesis_log = nemesis.log
        self.report.faults_past_load = past_load

    def _serve(self) -> None:
        """SIGKILL serve (in a cluster, each node in turn) and start it again on its data dir and port."""
        self.kill_and_restart(self.servers[self.report.serve_kills % len(self.servers)])

    def kill_and_restart(self, victim: ServerProcess, probe: Any = None) -> None:
        """SIGKILL a node and start it again on its data dir and port; `probe` runs right after the kill."""
        victim.kill()
        if probe is not None:
            probe()
        self.report.serve_kills += 1
        self._read_wal(victim.data_dir)
        victim.env.update(self._server_env(self.report.serve_kills))
        url = victim.start(timeout=120)
        if self._silent is None:
            self._silent = threading.Thread(target=self._silent_clients, args=(url,), daemon=True)
            self._silent.start()

    def stop_node(self, node: ServerProcess) -> None:
        """SIGTERM a node: it hands its partitions over; acknowledged messages it keeps in its WAL are a problem
        only if it is not started again (the drain), so they are noted, not counted, here."""
        logged = node.log.stat().st_size
        node.stop()
        with node.log.open("rb") as log:
            log.seek(logged)
            if STRANDED_LOG in log.read():
                self.report.stranded_stops += 1

    def _read_wal(self, data: Path) -> None:
        """Whether the WAL a restart recovers holds batch chunks and single records of one partition."""
        from lakebroker.ingest_api.chunks import Chunk
        from lakebroker.ingest_api.wal import Wal

        report = Wal(Layout(data).wal_dir, segment_bytes=1 << 30, fsync=False).inspect()
        kinds: dict[tuple[bytes, int], set[bool]] = {}
        for item in report.items:
            kinds.setdefault((item.topic_id, item.partition), set()).add(isinstance(item, Chunk))
        if any(len(k) == 2 for k in kinds.values()):
            self.report.mixed_wal_restarts += 1

    def _silent_clients(self, url: str) -> None:
        """Clients that get an early answer (404: an unknown topic, from the request head) and go
        silent; each socket's time until the server closes it is recorded."""
        host, port = url.removeprefix("http://").split(":")
        body = b'{"value": "' + b"x" * 4000 + b'"}'
        socks: list[tuple[socket.socket, bytes]] = []
        for i in range(2 * SILENT_CLIENTS):
            sock = socket.create_connection((host, int(port)), timeout=SILENT_CLOSE_S + 5)
            head = (f"POST /v1/topics/silent-{i}/messages HTTP/1.1\r\nHost: {host}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            sock.sendall(head)
            socks.append((sock, body if i % 2 == 0 else body[: len(body) // 2]))
        started = time.monotonic()
        for sock, part in socks:
            with contextlib.suppress(OSError):
                sock.sendall(part)  # after the head: the answer may already be on its way
        for sock, _ in socks:
            closed_after = None
            with contextlib.suppress(OSError), sock:
                while time.monotonic() - started < SILENT_CLOSE_S:
                    if not sock.recv(65536):
                        closed_after = time.monotonic() - started
                        break
            self.report.silent_clients.append(closed_after)

    def _to_delete(self) -> None:
        self._patch_profiles("delete")

    def _to_compact(self) -> None:
        self._patch_profiles("compact")

    def _patch_profiles(self, policy: str) -> None:
        with httpx.Client(base_url=self.server.url, timeout=60) as client:
            r = client.patch("/v1/topics/profiles", json={"cleanup_policy": policy})
            if r.status_code != 200:
                raise BenchError(f"PATCH profiles cleanup_policy={policy}: {r.status_code} {r.text}")
        self.report.policy_patches += 1

    def _resume_big(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=60) as client:
            r = client.post("/v1/subscriptions/big-hooks/resume")
            if r.status_code != 200:
                raise BenchError(f"resuming big-hooks: {r.status_code} {r.text}")

    def _note_worker_rss(self, name: str) -> None:
        peak = peak_rss_mb(self.workers[name].pid)
        if peak is not None:
            self.report.delivery_peak_rss_mb = max(self.report.delivery_peak_rss_mb, peak)

    def _worker(self) -> None:
        name = ("worker-a", "worker-b")[self.report.worker_kills % 2]
        self._note_worker_rss(name)
        self.workers[name].send_signal(signal.SIGKILL)
        self.workers[name].wait(timeout=30)
        self.report.worker_kills += 1
        self.workers[name] = self._start_worker(name)

    def recreate(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=60) as client:
            r = client.delete("/v1/topics/churn")
            if r.status_code != 204:
                raise BenchError(f"deleting churn: {r.status_code} {r.text}")
            r = client.post("/v1/topics", json=self._topic("churn"))
            if r.status_code != 201:
                raise BenchError(f"re-creating churn: {r.status_code} {r.text}")
        self._until_every_node_has("churn", r.json()["topic_id"])
        self.churn_since = time.time()
        self.report.recreates += 1

    def _until_every_node_has(self, topic: str, topic_id: str) -> None:
        """Wait until every node serves the topic's new incarnation: until then a node may acknowledge
        a message for the one just deleted (docs/cluster.md: admin changes reach every node within a
        heartbeat), so only what is sent after this counts as the new incarnation's."""
        deadline = time.monotonic() + RECREATE_SEEN_S
        for server in self.servers:
            with httpx.Client(base_url=server.url, timeout=10) as client:
                while (serving := _serving(client, topic)) != topic_id:
                    if time.monotonic() > deadline:
                        self.report.problems.append(
                            f"{server.url} did not serve the re-created {topic} within {RECREATE_SEEN_S:.0f} s: "
                            f"it serves {f'the deleted incarnation {serving}' if serving else 'none'}, "
                            f"the new one is {topic_id}")
                        return
                    time.sleep(0.1)

    def _drain(self, url: str) -> None:
        for other in self.servers[1:]:  # graceful: each hands its partitions over; the first takes them all
            logged = other.log.stat().st_size
            other.stop()
            with other.log.open("rb") as log:
                log.seek(logged)
                if STRANDED_LOG in log.read():  # these nodes do not start again: what their WALs keep is lost
                    self.report.problems.append(f"{other.url} stopped with acknowledged messages in its WAL")
        self.server.stop()
        self.server.env.update(self._server_env(0, jobs=False))
        url = self.server.start(timeout=120)
        client = httpx.Client(base_url=url, timeout=60)

        def drained() -> bool:
            for topic in SUBSCRIBED:
                status = client.get(f"/v1/subscriptions/{topic}-hooks").json()
                if any(p["lag"] or p["in_flight"] for p in status["partitions"]):
                    return False
            return True

        if not wait_for(drained, self.plan.drain_timeout_s):  # the checks below say what is missing
            stuck = [f"{topic} p{p['partition']}: committed {p['committed_offset']} of {p['high_watermark']}, "
                     f"{p['in_flight']} in flight, {p['state']}, owner {p['owner']}"
                     for topic in SUBSCRIBED
                     for p in client.get(f"/v1/subscriptions/{topic}-hooks").json()["partitions"]
                     if p["lag"] or p["in_flight"]]
            self.report.stalled_partitions = max(1, len(stuck))
            self.report.problems.append(f"delivery did not drain within {self.plan.drain_timeout_s:.0f} s: "
                                        + "; ".join(stuck) + self._delivery_evidence())
        for topic in SUBSCRIBED:
            status = client.get(f"/v1/subscriptions/{topic}-hooks").json()
            self.report.retention_skips += sum(p["retention_skips"]["messages"] for p in status["partitions"])
            letters = client.get(f"/v1/subscriptions/{topic}-hooks/dead-letters", params={"limit": 10_000}).json()
            self._dead[topic] = {(d["partition"], d["offset"]) for d in letters["dead_letters"]}
        for name, proc in self.workers.items():
            self._note_worker_rss(name)
            stop_process(proc)  # graceful: offsets committed, leases released
        client.close()
        # A graceful restart (SIGTERM) whose schedule puts retention, key compaction and replication
        # first: on a busy machine a Spark run takes tens of seconds, and the checks need these.
        self.server.stop()
        self.server.env.update(self._server_env(0, drain=True))
        self.server.start(timeout=120)
        restarted = datetime.now(UTC)
        from lakebroker.tables import job_runs

        layout = self._layout()

        def settled() -> bool:
            runs = job_runs.last_runs(layout, limit=100_000)
            ok = {r["job"] for r in runs if r["outcome"] == "ok"}
            replicated = any(r["job"] == "replication" and r["outcome"] == "ok" and r["started_at"] >= restarted
                             for r in runs)
            return (replicated and {"key-compaction", *(["compaction"] if self._need_compaction else [])} <= ok
                    and any(s > 0 for s in self._log_starts("events").values()))

        if not wait_for(settled, self.plan.jobs_timeout_s, step=2):
            self.report.jobs_wait_timed_out = 1
            self.report.problems.append(f"the jobs after the drain did not end in {self.plan.jobs_timeout_s:.0f} s")

    def _layout(self) -> Layout:
        return Layout(self.data, self.shared.get("LAKEBROKER_TABLES_URI"))

    @property
    def _need_compaction(self) -> bool:
        """A short run's serve is killed before a compaction finishes; a long run must see one succeed."""
        return self.plan.minutes >= 3

    # --- the checks ---

    def _delivery_evidence(self) -> str:
        """For a drain that timed out: each lease as its holder last wrote it, and each worker's last
        warnings, since the work dir of a CI run is gone by the time anyone reads its report."""
        now = datetime.now(UTC)
        rows = delta.load(self._layout().leases_table).to_pyarrow_table().to_pylist()
        leases = [f"{r['group']} p{r['partition']} owner {r['owner']} epoch {r['epoch']} expires in "
                  f"{(r['expires_at'] - now).total_seconds():.1f} s status {r['status']}"
                  for r in rows if r["kind"] == "lease"]
        members = [f"{r['owner']} expires in {(r['expires_at'] - now).total_seconds():.1f} s"
                   for r in rows if r["kind"] == "member"]
        logs = []
        for name in self.workers:
            lines = (self.work / f"{name}.log").read_text(errors="replace").splitlines()
            alive = "running" if self.workers[name].poll() is None else f"exited {self.workers[name].returncode}"
            logs.append(f"{name} ({alive}), last warnings: "
                        + " | ".join([x for x in lines if " WARNING " in x or " ERROR " in x][-8:]))
        return "\n  leases: " + "; ".join(leases) + "\n  members: " + "; ".join(members) + "\n  " + "\n  ".join(logs)

    def _keep_evidence(self) -> None:
        """What the checks read besides the tables, kept in the work dir for a post-mortem."""
        with (self.work / "deliveries.jsonl").open("wb") as out:
            for got in list(self.receiver.received):
                out.write(orjson.dumps({"webhook-id": got.headers.get("webhook-id"), "at": got.at,
                                        "worker": got.headers.get("lakebroker-worker"), "body": got.json}) + b"\n")
        (self.work / "dead_letters.json").write_bytes(orjson.dumps({t: sorted(d) for t, d in self._dead.items()}))

    def _log_starts(self, topic: str) -> dict[int, int]:
        from lakebroker.tables.log_start import log_starts

        table = delta.load(topic_table(self._layout(), topic))
        starts: dict[int, int] = log_starts(table, SPECS[topic].partitions)
        return starts

    def _verify_replica(self) -> None:
        proc = subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(self.data), "verify-replica",
                               "--to", str(self.replica)], cwd=REPO, capture_output=True, text=True, timeout=600,
                              env={**os.environ, **self.shared})
        self.report.replica_verified = proc.returncode == 0
        self.report.replica_output = (proc.stdout + proc.stderr)[-3000:]
        if not self.report.replica_verified:
            self.report.problems.append(f"verify-replica exit {proc.returncode}: "
                                        + " ".join(self.report.replica_output.splitlines()[-3:]))

    def _check(self) -> None:
        from lakebroker.tables import job_runs

        probes = self.work / "probe-acks.jsonl"
        lines = self.acks_file.read_bytes().splitlines() + (probes.read_bytes().splitlines() if probes.exists() else [])
        acks = [orjson.loads(line) for line in lines if line.strip()]
        self.report.probes_acked = sum(1 for a in acks if a["kind"] == "probe")
        self.report.acked_by_mode = dict(sorted(Counter(
            f"ack={a['ack']}, {'keyed' if a.get('key') is not None else 'keyless'}" for a in acks).items()))
        acks = [a for a in acks if a["topic"] != "churn" or a["sent"] >= self.churn_since]  # this incarnation
        self.report.receiver_answers = {str(k): v for k, v in sorted(Counter(self.receiver.answers).items())}
        logs = "".join(server.log.read_text() for server in self.servers)
        starts = re.findall(r"lakebroker\.spark_pipeline\.scheduler: starting ([a-z-]+):", logs)
        self.report.job_starts = dict(sorted(Counter(starts).items()))
        check_all(self.report, self._layout(), SPECS, acks, self.receiver.messages(), self._dead)
        if self.nemesis is not None:
            check_nemesis(self.report)
        if self._silent is not None:
            self._silent.join(timeout=SILENT_CLOSE_S + 10)
        open_ = sum(1 for t in self.report.silent_clients if t is None)
        self.report.silent_open = open_ + max(0, 2 * SILENT_CLIENTS - len(self.report.silent_clients))
        if open_ or len(self.report.silent_clients) != 2 * SILENT_CLIENTS:
            self.report.problems.append(f"{open_} of {2 * SILENT_CLIENTS} silent clients were still open after "
                                        f"{SILENT_CLOSE_S:.0f} s ({len(self.report.silent_clients)} measured)")
        if self.report.mixed_wal_restarts == 0:
            self.report.problems.append("no restart of serve recovered batch chunks and singles of one partition")
        if self.report.policy_patches != 2:
            self.report.problems.append(f"{self.report.policy_patches} of 2 cleanup_policy PATCHes of profiles ran")
        required = JOBS if self._need_compaction else JOBS[1:]
        check_jobs(self.report, job_runs.last_runs(self._layout(), limit=100_000), required)


def _serving(client: httpx.Client, topic: str) -> str | None:
    """The id of the topic incarnation a node serves, None if none (or no answer)."""
    try:
        r = client.get(f"/v1/topics/{topic}")
    except httpx.HTTPError:
        return None
    return str(r.json()["topic_id"]) if r.status_code == 200 else None


def run(minutes: float, work: Path, *, kill_every_s: float = 60.0, seed: int = 12, nodes: int = 1) -> SoakReport:
    """One soak of `minutes` of load; `work` holds its data and logs. `nodes` > 1: a cluster of that
    many `serve` processes sharing a table root, the producers spread over all, one killed at a time."""
    work.mkdir(parents=True, exist_ok=True)
    return Soak(SoakPlan.for_minutes(minutes, kill_every_s), work, seed, nodes).run()
