"""The built-in scheduler of `lakebroker serve`: each maintenance job on its own interval.

APScheduler (a BackgroundScheduler with a single worker thread) triggers the jobs; each run is
a child process, `python -m lakebroker.spark_pipeline.jobs.<job>`, with its own JVM, so the ingest process
never hosts one, and the single worker makes the runs take turns (one JVM at a time; compaction
and retention never race on a table). A run that is still going when its next turn comes is not
started twice (max_instances=1; missed turns coalesce into one). Every `serve` of a cluster has
this schedule; a run first takes its job's slot in `_system/job_slots` (tables/job_slots.py), so
each job runs once per interval across them all.

Intervals are settings (`compaction_interval_s`, `retention_interval_s`,
`key_compaction_interval_s`, `offsets_compaction_interval_s`, `replication_interval_s`; 0
disables one; replication also needs `replication_uri`). The child gets every setting through
the environment (`LAKEBROKER_*`), records its own run in `_system/job_runs` and exits 0 (ok),
1 (failed, recorded) or 2 (bad input). A child that dies otherwise (killed at `job_timeout_s`,
out of memory, a JVM crash) is recorded here as failed, with the tail of its log
(`<data_dir>/_jobs/<job>.log`, the last run of each job). On Linux a child also gets SIGTERM if
the broker dies (PR_SET_PDEATHSIG), so a SIGKILLed broker leaves no job behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from lakebroker.spark_pipeline.extra import missing_spark_message, spark_installed
from lakebroker.tables import job_runs
from lakebroker.tables.job_runs import JobName, JobResult
from lakebroker.tables.job_slots import JobSlots
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings

log = logging.getLogger(__name__)
# A run's slot (tables/job_slots.py) is renewed while it runs: a scheduler that dies mid-run frees it
# within a lease.
SLOT_LEASE_S = 30.0
SLOT_RENEW_S = 10.0


@dataclass(frozen=True)
class ScheduledJob:
    job: JobName
    module: str
    interval_setting: str

    def interval_s(self, settings: Settings) -> int:
        seconds: int = getattr(settings, self.interval_setting)
        if self.job is JobName.REPLICATION and not settings.replication_uri:
            return 0
        return seconds


JOBS = (
    ScheduledJob(JobName.COMPACTION, "lakebroker.spark_pipeline.jobs.compaction", "compaction_interval_s"),
    ScheduledJob(JobName.RETENTION, "lakebroker.spark_pipeline.jobs.retention", "retention_interval_s"),
    ScheduledJob(JobName.KEY_COMPACTION, "lakebroker.spark_pipeline.jobs.key_compaction", "key_compaction_interval_s"),
    ScheduledJob(JobName.OFFSETS_COMPACTION, "lakebroker.spark_pipeline.jobs.offsets_compaction",
                 "offsets_compaction_interval_s"),
    ScheduledJob(JobName.REPLICATION, "lakebroker.spark_pipeline.jobs.replication", "replication_interval_s"),
)


def job_env(settings: Settings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that gives a child process exactly these settings."""
    env = dict(os.environ if base is None else base)
    for name, value in settings.model_dump().items():
        key = f"LAKEBROKER_{name.upper()}"
        if value is None:
            env.pop(key, None)
        elif isinstance(value, bool):
            env[key] = "true" if value else "false"
        elif isinstance(value, str | int | float | Path):
            env[key] = str(value)
        else:
            env[key] = json.dumps(value, default=str)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def job_command(job: JobName, settings: Settings, *, topic: str | None = None, trigger: str = "scheduler",
                python: str | None = None) -> list[str]:
    """The command line of one run, as the scheduler, the Airflow DAGs and operators use it."""
    spec = next(s for s in JOBS if s.job is job)
    argv = [python or sys.executable, "-m", spec.module, "--data-dir", str(settings.data_dir),
            "--master", settings.spark_master, "--trigger", trigger]
    if topic is not None:
        argv += ["--topic", topic]
    if job is JobName.REPLICATION and settings.replication_uri:
        argv += ["--to", settings.replication_uri]
    return argv


def spark_home() -> Path:
    """pyspark's own directory: a complete SPARK_HOME (bin/spark-submit, bin/spark-class, jars/)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pyspark is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass(frozen=True)
class SparkSubmitRun:
    """One run in spark-submit's terms, as Airflow's SparkSubmitOperator takes them (`operator_kwargs`).

    No master: spark-submit's `--master` (the operator's: its connection's) decides, and the job
    keeps it (`build_spark_session`). The Delta jars go as `jars`, since the driver JVM starts
    before the job's Python does and cannot add them later."""

    application: str
    application_args: list[str]
    jars: str
    conf: dict[str, str]
    driver_memory: str
    name: str

    def operator_kwargs(self) -> dict[str, Any]:
        return {"application": self.application, "application_args": list(self.application_args),
                "jars": self.jars, "conf": dict(self.conf), "driver_memory": self.driver_memory, "name": self.name}


def spark_submit_run(job: JobName, settings: Settings, *, topic: str | None = None, trigger: str = "spark-submit",
                     extra_conf: dict[str, str] | None = None) -> SparkSubmitRun:
    """The run `job_command` describes, as a spark-submit of the job's script."""
    from lakebroker.spark_pipeline.session import session_conf

    spec = next(s for s in JOBS if s.job is job)
    conf = {**session_conf(settings.spark_jars_dir), **settings.spark_conf, **(extra_conf or {})}
    jars = conf.pop("spark.jars")
    driver_memory = conf.pop("spark.driver.memory", settings.spark_driver_memory)
    args = job_command(job, settings, topic=topic, trigger=trigger)[3:]
    at = args.index("--master")
    del args[at : at + 2]
    script = Path(__file__).resolve().parent / "jobs" / f"{spec.module.rsplit('.', 1)[-1]}.py"
    return SparkSubmitRun(application=str(script), application_args=args, jars=jars, conf=conf,
                          driver_memory=driver_memory, name=f"lakebroker-{job.value}")


def spark_submit_command(job: JobName, settings: Settings, *, topic: str | None = None,
                         trigger: str = "spark-submit", extra_conf: dict[str, str] | None = None) -> list[str]:
    """The same run as a `spark-submit` command line on the `spark_master` setting."""
    run = spark_submit_run(job, settings, topic=topic, trigger=trigger, extra_conf=extra_conf)
    argv = [str(spark_home() / "bin" / "spark-submit"), "--master", settings.spark_master, "--name", run.name,
            "--jars", run.jars, "--driver-memory", run.driver_memory]
    for key, value in run.conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, run.application, *run.application_args]


def _parent_death_signal() -> Any:
    """A pre-resolved `prctl(PR_SET_PDEATHSIG, SIGTERM)` for the child (Linux), so a job does not
    outlive a broker that was SIGKILLed; resolved here because nothing may be imported between
    fork and exec in a threaded process."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sigterm)

    return preexec


class JobRunner:
    """Runs one job at a time as a child process, and remembers it so shutdown can stop it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.layout = Layout.of(settings)
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._preexec = _parent_death_signal()
        self.slots = JobSlots(self.layout)

    def run(self, job: JobName) -> int | None:
        if self._stopping:
            return None
        spec = next(s for s in JOBS if s.job is job)
        try:
            elsewhere = self.slots.take(job, interval_s=spec.interval_s(self.settings), lease_s=SLOT_LEASE_S)
        except Exception:  # the tables are unreachable: the run would fail too; the next turn tries again
            log.exception("could not take the %s slot; skipping this turn", job.value)
            return None
        if elsewhere is not None:
            log.info("%s: not run here this turn (%s)", job.value, elsewhere)
            return None
        try:
            return self._run(job)
        finally:
            with contextlib.suppress(Exception):  # else the lease ends at its own expiry
                self.slots.finish(job)

    def _run(self, job: JobName) -> int | None:
        logs = self.layout.data_dir / "_jobs"
        logs.mkdir(parents=True, exist_ok=True)
        log_file = logs / f"{job.value}.log"
        started, t0 = datetime.now(UTC), time.monotonic()
        argv = job_command(job, self.settings)
        log.info("starting %s: %s", job.value, " ".join(argv))
        with log_file.open("wb") as out, self._lock:
            self._child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=job_env(self.settings),
                                           start_new_session=True, preexec_fn=self._preexec)
        child = self._child
        try:
            code = self._wait(child, job)
        finally:
            with self._lock:
                self._child = None
        duration_ms = int((time.monotonic() - t0) * 1000)
        if code in (0, 1, 2):
            log.log(logging.INFO if code == 0 else logging.WARNING, "%s finished with exit %d in %.1fs",
                    job.value, code, duration_ms / 1000)
        if code not in (0, 1) and not self._stopping:  # 1: the child recorded its failure itself
            tail = log_file.read_bytes()[-2000:].decode(errors="replace").strip().splitlines()[-5:]
            result = JobResult(job=job, run_id=f"crash-{int(started.timestamp())}", trigger="scheduler",
                               started_at=started, duration_ms=duration_ms,
                               error=f"exit {code}: " + " | ".join(tail)[:1000])
            try:
                job_runs.record(self.layout, result)
            except Exception:  # the scheduler must survive a failing disk; it is logged
                log.exception("could not record the failed %s run", job.value)
        return code

    def _wait(self, child: subprocess.Popen[bytes], job: JobName) -> int:
        """The child's exit code; its slot renewed while it runs, and the child killed at job_timeout_s."""
        deadline = time.monotonic() + self.settings.job_timeout_s
        while True:
            try:
                return child.wait(timeout=max(0.0, min(SLOT_RENEW_S, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    self._kill(child)
                    log.error("%s exceeded job_timeout_s=%d and was killed", job.value, self.settings.job_timeout_s)
                    return child.wait()
                try:
                    self.slots.renew(job, SLOT_LEASE_S)
                except Exception:  # the run goes on; its slot may lapse to another node meanwhile
                    log.exception("could not renew the %s slot", job.value)

    @staticmethod
    def _kill(child: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(child.pid, signal.SIGTERM)
            child.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

    def stop(self) -> None:
        self._stopping = True
        with self._lock:
            child = self._child
        if child is not None and child.poll() is None:
            self._kill(child)


class MaintenanceScheduler(BackgroundScheduler):  # type: ignore[misc]
    runner: JobRunner


def start_scheduler(settings: Settings, *, first_run_after_s: float | None = None) -> MaintenanceScheduler:
    """Start the jobs' schedule (background threads). Each job first runs one interval after start
    (or after `first_run_after_s`), then every interval."""
    runner = JobRunner(settings)
    scheduler = MaintenanceScheduler(
        executors={"default": ThreadPoolExecutor(max_workers=1)},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600},
        timezone=UTC,
    )
    scheduler.runner = runner
    now = datetime.now(UTC)
    due = [spec for spec in JOBS if spec.interval_s(settings) > 0]
    if due and not spark_installed():
        log.warning("maintenance jobs are off: %s", missing_spark_message(
            "scheduling " + ", ".join(spec.job.value for spec in due)))
        due = []
    for spec in due:
        interval = spec.interval_s(settings)
        first = now + timedelta(seconds=interval if first_run_after_s is None else first_run_after_s)
        scheduler.add_job(runner.run, IntervalTrigger(seconds=interval, timezone=UTC), args=[spec.job],
                          id=spec.job.value, name=f"lakebroker {spec.job.value}", next_run_time=first)
    scheduler.start()
    log.info("maintenance jobs scheduled: %s", ", ".join(
        f"{j.id} every {j.trigger.interval.total_seconds():.0f}s" for j in scheduler.get_jobs()) or "none")
    return scheduler


def shutdown(scheduler: MaintenanceScheduler) -> None:
    """Stop scheduling and stop the running child, if any (it re-plans on its next run)."""
    scheduler.runner.stop()
    scheduler.shutdown(wait=False)


def describe(scheduler: MaintenanceScheduler) -> list[dict[str, Any]]:
    """The schedule, for an ops endpoint or the dashboard."""
    return [{"job": j.id, "interval_s": j.trigger.interval.total_seconds(),
             "next_run": None if j.next_run_time is None else j.next_run_time.isoformat()}
            for j in scheduler.get_jobs()]
