"""serve's delivery worker as a supervised child process, so the ingest event loop never waits
on delivery and the two use both cores.

- Started once serve holds the data-dir lock; restarted with exponential backoff
  (`BACKOFF_MIN_S` doubling to `BACKOFF_MAX_S`, reset once a child ran `HEALTHY_S`) whenever it
  exits; stopped with serve (SIGTERM: it commits offsets and releases its leases, then SIGKILL
  after `STOP_TIMEOUT_S`). The child also dies with serve (delivery_worker/runner.py).
- Every incarnation uses serve's worker id: the supervisor has reaped the previous one, so the
  next resumes its leases at once instead of waiting `lease_ttl_s` for them to expire.
- Its logs go to serve's stderr, prefixed `delivery[<pid>]`. Its metrics are written to files
  (prometheus_client's multiprocess mode) that serve's /metrics reads, so one scrape covers both.
- Live partition status comes from the leases table, where every worker heartbeats it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from lakebroker.delivery_worker.pipeline import PipelineStatus
from lakebroker.tables.settings import Settings

log = logging.getLogger(__name__)
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
HEALTHY_S = 60.0
STOP_TIMEOUT_S = 20.0


class _ChildMetrics(Collector):
    """The child's metric files, merged (counters of earlier incarnations included, so they never go back)."""

    def __init__(self) -> None:
        self.path: str | None = None

    def collect(self) -> Iterable[Metric]:
        if self.path is None or not os.path.isdir(self.path):
            return []
        metrics: Iterable[Metric] = MultiProcessCollector(None, self.path).collect()  # type: ignore[no-untyped-call]
        return metrics


class DeliveryProcess:
    def __init__(self, settings: Settings, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.worker_id = f"serve-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.pid: int | None = None
        self._metrics = _ChildMetrics()
        registry.register(self._metrics)
        self._restarts = Counter("lakebroker_delivery_process_restarts", "Times serve restarted its delivery "
                                 "process after it exited.", registry=registry)
        self._up = Gauge("lakebroker_delivery_process_up", "1 while serve's delivery process runs.",
                         registry=registry)
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()

    async def start(self) -> None:
        self._metrics.path = tempfile.mkdtemp(prefix="lakebroker-delivery-metrics-")
        self._task = asyncio.create_task(self._supervise(), name="delivery-supervisor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.error("delivery process %d did not stop within %.0f s; killing it", proc.pid, STOP_TIMEOUT_S)
                proc.kill()
                await proc.wait()
            self._exited(proc)
            log.info("delivery process %d stopped (%s)", proc.pid, _describe(proc.returncode or 0))
        if self._metrics.path is not None:
            shutil.rmtree(self._metrics.path, ignore_errors=True)
            self._metrics.path = None

    async def wait_started(self) -> int:
        """The pid of the running child, once one runs."""
        await self._started.wait()
        assert self.pid is not None
        return self.pid

    def status(self, name: str) -> dict[int, PipelineStatus]:
        return {}  # the child heartbeats its live status into the leases table

    # -- supervision ----------------------------------------------------------------------
    async def _supervise(self) -> None:
        backoff = BACKOFF_MIN_S
        while True:
            began = time.monotonic()
            try:
                proc = await self._spawn()
            except OSError:
                log.exception("could not start the delivery process")
            else:
                code = await proc.wait()
                self._exited(proc)
                log.error("delivery process %d exited with %s after %.1f s; restarting it in %.1f s", proc.pid,
                          _describe(code), time.monotonic() - began, backoff)
                self._restarts.inc()
            if time.monotonic() - began >= HEALTHY_S:
                backoff = BACKOFF_MIN_S
            await asyncio.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    async def _spawn(self) -> asyncio.subprocess.Process:
        assert self._metrics.path is not None
        settings = self.settings.model_dump(mode="json", exclude={"token"})  # delivery needs no API token
        settings["data_dir"] = str(Path(self.settings.data_dir).resolve())
        order = orjson.dumps({"settings": settings, "parent_pid": os.getpid(), "worker_id": self.worker_id})
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lakebroker.delivery_worker.child", stdin=asyncio.subprocess.PIPE,
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": self._metrics.path},
            start_new_session=True,  # a Ctrl-C at serve's terminal reaches serve, which stops the child in order
        )
        assert proc.stdin is not None
        proc.stdin.write(order)
        with contextlib.suppress(ConnectionError):  # it died at once: reaped and restarted as any exit is
            await proc.stdin.drain()
        proc.stdin.close()
        self._proc, self.pid = proc, proc.pid
        self._up.set(1)
        self._started.set()
        log.info("delivery process %d started (worker %s)", proc.pid, self.worker_id)
        return proc

    def _exited(self, proc: asyncio.subprocess.Process) -> None:
        self._up.set(0)
        self._started.clear()
        self.pid = None
        if self._metrics.path is not None:
            # Its live gauges (lag, in flight) stop counting.
            mark_process_dead(proc.pid, self._metrics.path)  # type: ignore[no-untyped-call]


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"code {code}"
