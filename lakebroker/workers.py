"""`lakebroker serve --workers N`: N ingest processes on one port, each a node of its own.

Python runs one thread of the produce path at a time, so one process uses about one core. Here N
`serve` processes share the port through SO_REUSEPORT (the kernel spreads connections over them),
and each is a cluster node (ingest_api/cluster.py) with its own WAL and dedup state, sharing the
table root: the data dir's own tables, unless `tables_uri` names others. Worker 0 keeps the data
dir itself, so a data dir served by one process and later by several keeps its WAL; worker i > 0
uses `DATA_DIR/nodes/i`. Each worker advertises a port of its own for the messages other nodes
forward to it, at the host a single node would advertise (lakebroker/server.py `worker_url`).

When there are no more workers than CPUs this process may use, worker i runs on the i-th of them,
as a thread-per-core broker runs a shard per core: left to the scheduler, two workers and the
load's own processes on two cores moved between them, each request cost a third more CPU than in
one process, and the cores sat a quarter idle.

This process only watches: it restarts a worker that dies, runs the scheduled Spark jobs once for
all of them, and on SIGTERM stops them all.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lakebroker.server import listen
from lakebroker.tables.layout import Layout
from lakebroker.tables.lock import DataDirLock
from lakebroker.tables.logs import configure_logging
from lakebroker.tables.settings import Settings

log = logging.getLogger(__name__)
RESTART_AFTER_S = 1.0
STOP_TIMEOUT_S = 40.0  # uvicorn's graceful shutdown (10 s) plus the final flush
_JOBS = ("COMPACTION", "RETENTION", "KEY_COMPACTION", "OFFSETS_COMPACTION", "REPLICATION")


def worker_dir(settings: Settings, index: int) -> Path:
    return settings.data_dir if index == 0 else settings.data_dir / "nodes" / str(index)


def worker_cpus(workers: int, pin: bool) -> list[int | None]:
    """The CPU each worker runs on: one each when there are enough, else none (the scheduler's choice)."""
    allowed = sorted(os.sched_getaffinity(0))
    if not pin or workers > len(allowed):
        return [None] * workers
    return list(allowed[:workers])


def run_workers(settings: Settings, workers: int, *, pin_cpus: bool = True) -> int:
    configure_logging(settings)
    settings.ensure_dirs()
    for index in range(workers):  # refused here, not by a worker restarted every second
        data = worker_dir(settings, index)
        DataDirLock(Layout(data).lock_file).refuse_if_held(data)
    # Bound (not listening) for as long as the workers run: the port is ours even when it was 0.
    held = listen(settings.host, settings.port, reuse_port=True)
    port = held.getsockname()[1]
    env = dict(os.environ)  # LAKEBROKER_ADVERTISED_URL too: each worker advertises its host (server.worker_url)
    env["LAKEBROKER_TABLES_URI"] = Layout.of(settings).tables_root
    env.update({f"LAKEBROKER_{job}_INTERVAL_S": "0" for job in _JOBS})  # scheduled here, once
    held_kafka = None
    if settings.kafka_listener:  # the Kafka port is shared the same way
        held_kafka = listen(settings.host, settings.kafka_port, reuse_port=True)
        env["LAKEBROKER_KAFKA_PORT"] = str(held_kafka.getsockname()[1])
    cpus = worker_cpus(workers, pin_cpus)

    def start(index: int) -> subprocess.Popen[bytes]:
        data = worker_dir(settings, index)
        data.mkdir(parents=True, exist_ok=True)
        cpu = cpus[index]
        return subprocess.Popen([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "serve",
                                 "--host", settings.host, "--port", str(port), "--reuse-port",
                                 *([] if cpu is None else ["--cpu", str(cpu)])], env=env)

    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    procs = [start(i) for i in range(workers)]
    log.info("serving on %s:%d%s with %d worker processes (pids %s)%s", settings.host, port,
             f" (Kafka :{env['LAKEBROKER_KAFKA_PORT']})" if held_kafka else "", workers,
             ", ".join(str(p.pid) for p in procs),
             "" if cpus[0] is None else f" on CPUs {', '.join(str(c) for c in cpus)}")

    from lakebroker.spark_pipeline.scheduler import shutdown as stop_jobs
    from lakebroker.spark_pipeline.scheduler import start_scheduler

    jobs = start_scheduler(settings)
    try:
        while not stopping:
            time.sleep(0.2)
            for i, proc in enumerate(procs):
                if proc.poll() is not None and not stopping:
                    log.error("worker %d (pid %d) exited with %s; restarting it", i, proc.pid, proc.returncode)
                    time.sleep(RESTART_AFTER_S)
                    procs[i] = start(i)
    finally:
        stop_jobs(jobs)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        held.close()
        if held_kafka is not None:
            held_kafka.close()
    return max((p.returncode or 0 for p in procs), default=0)
