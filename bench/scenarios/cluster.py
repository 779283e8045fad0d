"""Several ingest nodes: `serve --workers 2` against one process on the same port shape, `ack=none` against
`ack=wal`, and how long a partition is out of service when its owner is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from bench.harness.compare import Measured, Target, alternate, interleave, percentile
from bench.harness.servers import NO_JOBS, REPO, BenchError, Server, baseline_server, create_topic, lakebroker_server
from bench.harness.wrk import LoadResult, finish_wrk, run_wrk, start_wrk, write_script
from bench.result import Check, Mode, Result, Scenario, table
from bench.scenarios.s3 import ACCESS_KEY, SECRET_KEY
from bench.scenarios.single_produce import SINGLE_BODY
from scripts.s3_process import start as start_s3

TARGET_WORKERS_RATIO = 1.3  # --workers 2 over one process, single-message keyless produce
# Keyed: half the connections land on the worker that does not own the key's partition, which
# forwards each message; the second worker must still not cost throughput.
TARGET_KEYED_WORKERS_RATIO = 1.0
KEY = "user-1"
KEYED_BODY = orjson.dumps({"key": KEY, **orjson.loads(SINGLE_BODY)})
CONNECTIONS = 32  # `wrk -t1 -c32`, as the issue states the target
PARTITIONS = 4
S3_PARTITIONS = 6
S3_CONNECTIONS = 30
PATH = "/v1/topics/bench/messages"


@dataclass(frozen=True)
class Sizes:
    duration_s: float
    warmup_s: float
    rounds: int
    kills: int


SIZES = {"full": Sizes(10, 3, 2, 10), "quick": Sizes(3, 1, 1, 3), "tiny": Sizes(1, 0.5, 1, 1)}


def _workers_server(data: Path, workers: int) -> Server:
    server = lakebroker_server(data, env=NO_JOBS)
    return Server(name=f"lakebroker --workers {workers}", argv=[*server.argv, "--workers", str(workers)],
                  ready_file=server.ready_file, log=server.log, env=server.env, ready_path="/readyz")


def _wait_owned(url: str, nodes: int, timeout_s: float = 60, partitions: int = PARTITIONS) -> dict[int, str]:
    """Until every partition of `bench` has an owner among `nodes` live nodes; the owners' URLs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = httpx.get(f"{url}/v1/cluster", timeout=10).json()
        owners = {p["partition"]: p["url"] for p in answer["partitions"] if p["topic"] == "bench"}
        alive = {n["url"] for n in answer["nodes"] if n["alive"]}
        if len(alive) == nodes and len(owners) == partitions and set(owners.values()) == alive:
            return owners
        time.sleep(0.2)
    raise BenchError(f"the partitions of {url} did not settle on {nodes} nodes in {timeout_s} s")


def _throughput(sz: Sizes, work: Path) -> tuple[dict[str, Measured], float | None]:
    base, base2 = baseline_server(work, "bare"), baseline_server(work, "bare", processes=2)
    one = lakebroker_server(work / "one-data", env=NO_JOBS)
    two = _workers_server(work / "two-data", 2)
    servers = [base, base2, one, two]
    try:
        for s in servers:
            s.launch()
        for s in servers:
            s.wait_ready()
        create_topic(one.url, "bench", PARTITIONS)
        create_topic(two.url, "bench", PARTITIONS)
        _wait_owned(two.url, 2)
        pairs = [(base, PATH), (base2, PATH), (one, PATH), (two, PATH), (one, PATH + "?ack=none")]
        targets = [Target(server, path, f"cluster-{i}", SINGLE_BODY, "application/json")
                   for i, (server, path) in enumerate(pairs)]
        targets += [Target(server, PATH, f"cluster-keyed-{i}", KEYED_BODY, "application/json")
                    for i, server in enumerate((one, two))]
        alternate(1, sz.warmup_s, pairs, work, "cluster-warmup", SINGLE_BODY, "application/json", CONNECTIONS)
        alternate(1, sz.warmup_s, [(two, PATH)], work, "cluster-keyed-warmup", KEYED_BODY, "application/json",
                  CONNECTIONS)
        got = interleave(sz.rounds, sz.duration_s, targets, work, CONNECTIONS)
        peak = one.peak_rss_mb()
    finally:
        for s in servers:
            s.stop()
    return dict(zip(("bare", "bare2", "one", "two", "none", "one_keyed", "two_keyed"), got, strict=True)), peak


def _node(root: Path, data: Path, port: int = 0) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **NO_JOBS, "LAKEBROKER_TABLES_URI": str(root)}
    (data / "server.json").unlink(missing_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    with (data.parent / f"{data.name}.log").open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "serve", "--port",
                                 str(port), "--kafka-port", "0"], stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=REPO)


def _url_of(data: Path, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            url = str(orjson.loads((data / "server.json").read_bytes())["url"])
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return url
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            pass
        time.sleep(0.05)
    raise BenchError(f"the node in {data} did not start in {timeout_s} s")


def _failover(sz: Sizes, work: Path) -> list[float]:
    """Seconds from a SIGKILL to the first produce the survivor answers 200 for a partition the dead
    node owned, at the default lease TTL; the killed node restarts (same data dir and port) between kills."""
    root = work / "failover-tables"
    datas = [work / "failover-a", work / "failover-b"]
    procs = [_node(root, datas[0]), _node(root, datas[1])]
    times: list[float] = []
    try:
        urls = [_url_of(d) for d in datas]
        ports = [int(u.rsplit(":", 1)[1]) for u in urls]
        create_topic(urls[0], "bench", PARTITIONS)
        for k in range(sz.kills):
            owners = _wait_owned(urls[0], 2)
            victim, survivor = k % 2, 1 - k % 2
            partition = next(p for p, url in owners.items() if url == urls[victim])
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(timeout=30)
            killed = time.monotonic()
            while True:
                r = httpx.post(f"{urls[survivor]}{PATH}", json={"value": "x", "partition": partition}, timeout=30)
                if r.status_code == 200:
                    break
                if time.monotonic() - killed > 120:
                    raise BenchError(f"partition {partition} not served 120 s after its owner died: {r.text}")
                time.sleep(0.02)
            times.append(time.monotonic() - killed)
            procs[victim] = _node(root, datas[victim], ports[victim])
            _url_of(datas[victim])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    return times


def _on_s3(sz: Sizes, work: Path) -> tuple[LoadResult, list[LoadResult]]:
    """One node on the local S3 server under one wrk, then three nodes on it under one wrk each with a
    third of the connections (the same total load), keyless single messages at ack=wal."""
    minio = start_s3(work / "minio", ACCESS_KEY, SECRET_KEY)
    script = write_script(work, "cluster-s3", SINGLE_BODY, "application/json")
    try:
        env = {**NO_JOBS, **minio.env, "LAKEBROKER_DELIVER_IN_SERVE": "false"}
        one = lakebroker_server(work / "s3-one", env={**env, "LAKEBROKER_TABLES_URI": minio.uri("one")})
        with one:
            create_topic(one.url, "bench", S3_PARTITIONS)
            run_wrk(one.url + PATH, script, S3_CONNECTIONS, sz.warmup_s)
            single = run_wrk(one.url + PATH, script, S3_CONNECTIONS, sz.duration_s)
        shared = minio.uri("three")  # one table root for the three (each uri() call is a fresh prefix)
        three = [lakebroker_server(work / f"s3-three-{i}", env={**env, "LAKEBROKER_TABLES_URI": shared})
                 for i in range(3)]
        try:
            for node in three:
                node.start()
            create_topic(three[0].url, "bench", S3_PARTITIONS)
            _wait_owned(three[0].url, 3, partitions=S3_PARTITIONS)
            for node in three:
                run_wrk(node.url + PATH, script, S3_CONNECTIONS // 3, sz.warmup_s)
            loads = [start_wrk(node.url + PATH, script, S3_CONNECTIONS // 3, sz.duration_s) for node in three]
            spread = [finish_wrk(proc, sz.duration_s, S3_CONNECTIONS // 3) for proc in loads]
        finally:
            for node in three:
                node.stop()
    finally:
        minio.stop()
    return single, spread


def run(mode: Mode, work: Path) -> Result:
    sz = SIZES[mode]
    got, peak = _throughput(sz, work)
    kills = _failover(sz, work)
    single_s3, spread_s3 = _on_s3(sz, work)
    three_rps = sum(r.ok_rps for r in spread_s3)
    bare, bare2, one, two, none = got["bare"], got["bare2"], got["one"], got["two"], got["none"]
    one_keyed, two_keyed = got["one_keyed"], got["two_keyed"]
    ratio = two.ok_rps / one.ok_rps if one.ok_rps else 0.0
    keyed_ratio = two_keyed.ok_rps / one_keyed.ok_rps if one_keyed.ok_rps else 0.0
    bare_ratio = bare2.rps / bare.rps if bare.rps else 0.0
    none_ratio = none.ok_rps / one.ok_rps if one.ok_rps else 0.0
    ttl = 8.0
    checks = [
        Check("--workers 2 over one process, single-message produce", ratio, "x", TARGET_WORKERS_RATIO,
              baseline=f"one process {one.ok_rps:,.0f} msg/s, --workers 2 {two.ok_rps:,.0f} msg/s; bare ASGI "
                       f"{bare.rps:,.0f} req/s, in two processes {bare2.rps:,.0f} ({bare_ratio:.2f}x)"),
        Check("--workers 2 over one process, keyed single-message produce (one key)", keyed_ratio, "x",
              TARGET_KEYED_WORKERS_RATIO,
              baseline=f"one process {one_keyed.ok_rps:,.0f} msg/s, --workers 2 {two_keyed.ok_rps:,.0f} msg/s, half "
                       "of them forwarded to the key's owner"),
        Check("ack=none over ack=wal, one process", none_ratio, "x", 1.0,
              baseline=f"ack=wal {one.ok_rps:,.0f} msg/s, ack=none {none.ok_rps:,.0f} msg/s"),
        Check("failover: SIGKILL to the first produce served on a moved partition, max", max(kills), "s",
              ttl + 2, higher_is_better=False,
              baseline=f"p50 {percentile(kills, 0.5):.1f} s over {len(kills)} kills; lease TTL {ttl:g} s"),
    ]
    return Result(
        scenario="cluster", checks=checks,
        headlines=[f"--workers 2: {two.ok_rps:,.0f} msg/s, {ratio:.2f}x one process",
                   f"--workers 2, one key: {two_keyed.ok_rps:,.0f} msg/s, {keyed_ratio:.2f}x one process",
                   f"failover p50 {percentile(kills, 0.5):.1f} s, max {max(kills):.1f} s"],
        tables=[
            table(f"Single-message keyless produce, {CONNECTIONS} connections, alternating A-B then B-A.",
                  ["server", "msg/s", "req/s", "p50 ms", "p99 ms", "server CPU µs/msg", "server cores", "errors",
                   "ratio to bare ASGI"],
                  [[label, *m.row(), f"{m.ok_rps / bare.rps:.2f}" if bare.rps else "0"]
                   for label, m in (("bare ASGI app", bare), ("bare ASGI app, two processes", bare2),
                                    ("lakebroker, one process, ack=wal", one),
                                    ("lakebroker --workers 2, ack=wal", two),
                                    ("lakebroker, one process, ack=none", none))]),
            table(f"Single-message produce with one key (`{KEY}`), {CONNECTIONS} connections, in the same "
                  "alternation: through `--workers 2` the connections that reach the worker which does not own the "
                  "key's partition are forwarded to the other.",
                  ["server", "msg/s", "req/s", "p50 ms", "p99 ms", "server CPU µs/msg", "server cores", "errors"],
                  [[label, *m.row()] for label, m in (("lakebroker, one process, ack=wal", one_keyed),
                                                      ("lakebroker --workers 2, ack=wal", two_keyed))]),
            table("Failover: each kill alternates between the two nodes; the killed node restarts in between.",
                  ["kill", "seconds to the first produce served"], [[i + 1, f"{t:.2f}"] for i, t in enumerate(kills)]),
            table(f"Tables on the local S3 server: one node under `wrk -c{S3_CONNECTIONS}`, then three nodes under "
                  f"one `wrk -c{S3_CONNECTIONS // 3}` each, at once (keyless, ack=wal, {S3_PARTITIONS} partitions).",
                  ["nodes", "msg/s", "p50 ms", "p99 ms", "errors", "ratio to one node"],
                  [[1, f"{single_s3.ok_rps:,.0f}", f"{single_s3.p50_ms:.1f}", f"{single_s3.p99_ms:.1f}",
                    single_s3.errors, "1.00"],
                   [3, f"{three_rps:,.0f}", f"{max(r.p50_ms for r in spread_s3):.1f}",
                    f"{max(r.p99_ms for r in spread_s3):.1f}", sum(r.errors for r in spread_s3),
                    f"{three_rps / single_s3.ok_rps:.2f}" if single_s3.ok_rps else "0"]]),
        ],
        notes=["Server CPU of `--workers 2` and of the bare app's two processes counts the first process only "
               "(the pid in its ready file); the rate is both processes'.",
               f"The bare app, which does nothing per request, gains {bare_ratio:.2f}x from a second process: "
               "`wrk` shares the two cores with the servers, so two processes get what `wrk` leaves, and each "
               "request costs more CPU once three busy processes take turns on two cores.",
               "Three nodes and three load generators share the machine's two cores, so the three-node figure "
               "shows the cost of a cluster's coordination on one machine, not its capacity on three."],
        figures={"one_rps": one.ok_rps, "two_rps": two.ok_rps, "none_rps": none.ok_rps, "bare_rps": bare.rps,
                 "one_keyed_rps": one_keyed.ok_rps, "two_keyed_rps": two_keyed.ok_rps,
                 "bare2_rps": bare2.rps,
                 "failover_s": kills, "peak_rss_mb": peak, "command": one.command, "s3_one_rps": single_s3.ok_rps,
                 "s3_three_rps": three_rps},
    )


SCENARIO = Scenario(
    name="cluster", title="Several ingest nodes", measure=run,
    setup="The bare ASGI app in one process and in two (SO_REUSEPORT, a CPU each, as `--workers` runs), one "
          "`lakebroker serve`, and `lakebroker serve --workers 2` (two processes on one "
          "port through SO_REUSEPORT, each a node with its own WAL, sharing the data dir's tables), scheduled "
          f"Spark jobs off, a topic of {PARTITIONS} partitions on each; for failover, two nodes on one local "
          "table root at the default lease TTL (8 s); then one node, and three nodes, with their tables on the "
          f"local S3 server (MinIO), a topic of {S3_PARTITIONS} partitions.",
    load=f"wrk `-t1 -c{CONNECTIONS}`, closed loop, `POST {PATH}` with the single-produce scenario's "
         f"{len(SINGLE_BODY)}-byte keyless JSON body at ack=wal (and ack=none on the one process), and the same "
         f"body with the key `{KEY}` on one process and on `--workers 2`, 10 s per run, A-B then B-A; failover: "
         "10 SIGKILLs alternating between the nodes, then a produce to a partition the "
         "dead node owned through the survivor every 20 ms until it is answered 200; on S3, one wrk "
         f"`-c{S3_CONNECTIONS}` against one node, then three wrk `-c{S3_CONNECTIONS // 3}` at once, one per node.",
    metric="Messages per second of each server and their ratios; seconds from each SIGKILL to the first 200.",
    target=f"--workers 2 ≥ {TARGET_WORKERS_RATIO:g}x one process keyless and ≥ {TARGET_KEYED_WORKERS_RATIO:g}x "
           "with one key; ack=none ≥ ack=wal; every failover within the "
           "lease TTL plus 2 s.",
)
