"""The built-in scheduler: `lakebroker serve` runs the jobs as child processes (no JVM in serve)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from lakebroker.spark_pipeline.scheduler import (
    JobRunner,
    job_command,
    job_env,
    shutdown,
    spark_submit_run,
    start_scheduler,
)
from lakebroker.tables import job_runs
from lakebroker.tables.job_runs import JobName
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from tests.servers import ServerProcess
from tests.waiting import eventually

pytestmark = pytest.mark.spark


def test_job_env_carries_every_setting(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d", compaction_target_file_bytes=4096, retention_trim_partial_files=True,
                        replication_uri="/replica", vacuum_retention_hours=1.5,
                        spark_conf={"spark.sql.shuffle.partitions": "64"})
    env = job_env(settings, base={"LAKEBROKER_REPLICATION_URI": "stale", "PATH": "/bin"})
    assert env["LAKEBROKER_COMPACTION_TARGET_FILE_BYTES"] == "4096"
    assert env["LAKEBROKER_RETENTION_TRIM_PARTIAL_FILES"] == "true"
    child = {k: v for k, v in env.items() if k.startswith("LAKEBROKER_")}
    saved = dict(os.environ)
    try:
        os.environ.update(child)
        assert Settings() == settings  # the child process sees exactly these settings
    finally:
        os.environ.clear()
        os.environ.update(saved)
    no_uri = job_env(settings.model_copy(update={"replication_uri": None}), base={"LAKEBROKER_REPLICATION_URI": "x"})
    assert "LAKEBROKER_REPLICATION_URI" not in no_uri


def test_job_command_is_a_python_module_entry_point(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, spark_master="spark://h:7077", replication_uri="/r")
    assert job_command(JobName.COMPACTION, settings, topic="t") == [
        sys.executable, "-m", "lakebroker.spark_pipeline.jobs.compaction", "--data-dir", str(tmp_path),
        "--master", "spark://h:7077", "--trigger", "scheduler", "--topic", "t"]
    assert job_command(JobName.REPLICATION, settings)[-2:] == ["--to", "/r"]


def test_spark_conf_goes_to_spark_submit_over_lakebrokers_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKEBROKER_SPARK_CONF", raising=False)  # scripts/test.sh sets one
    own = spark_submit_run(JobName.COMPACTION, Settings(data_dir=tmp_path)).conf
    assert own["spark.sql.shuffle.partitions"] == "4"
    settings = Settings(data_dir=tmp_path, spark_conf={"spark.sql.shuffle.partitions": "64", "spark.x.y": "z"})
    run = spark_submit_run(JobName.COMPACTION, settings, extra_conf={"spark.x.y": "w"})
    assert run.conf["spark.sql.shuffle.partitions"] == "64"
    assert run.conf["spark.x.y"] == "w"  # a caller's own extra_conf still comes last
    with pytest.raises(ValidationError, match=r"spark_conf may not set spark\.delta\.logStore\.file\.impl"):
        Settings(data_dir=tmp_path, spark_conf={"spark.delta.logStore.file.impl": "x"})


def test_schedule_follows_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, compaction_interval_s=60, retention_interval_s=0,
                        key_compaction_interval_s=0, offsets_compaction_interval_s=600, replication_interval_s=30)
    scheduler = start_scheduler(settings)
    try:
        # No replication_uri: no replication, whatever its interval.
        assert sorted(j.id for j in scheduler.get_jobs()) == ["compaction", "offsets-compaction"]
    finally:
        shutdown(scheduler)
    with_uri = start_scheduler(settings.model_copy(update={"replication_uri": str(tmp_path / "r")}))
    try:
        assert "replication" in {j.id for j in with_uri.get_jobs()}
    finally:
        shutdown(with_uri)


def test_a_child_killed_at_the_timeout_is_recorded_failed(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", job_timeout_s=1)
    runner = JobRunner(settings)
    code = runner.run(JobName.COMPACTION)
    assert code is not None and code < 0  # killed by a signal
    (row,) = job_runs.last_runs(Layout(settings.data_dir))
    assert row["job"] == "compaction" and row["outcome"] == "failed" and row["trigger"] == "scheduler"
    assert row["error"].startswith(f"exit {code}")


def test_serve_runs_scheduled_compaction_in_a_child_process(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data, env={
        "LAKEBROKER_FLUSH_INTERVAL_MS": "20", "LAKEBROKER_COMPACTION_INTERVAL_S": "5",
        "LAKEBROKER_RETENTION_INTERVAL_S": "0", "LAKEBROKER_KEY_COMPACTION_INTERVAL_S": "0",
        "LAKEBROKER_OFFSETS_COMPACTION_INTERVAL_S": "0", "LAKEBROKER_SPARK_MASTER": "local[1]",
        "LAKEBROKER_DELIVER_IN_SERVE": "false"})
    url = server.start()
    try:
        assert httpx.post(url + "/v1/topics", json={"name": "ticks", "partitions": 1}).status_code == 201
        for i in range(12):  # twelve flushes: twelve small files
            r = httpx.post(url + "/v1/topics/ticks/messages?ack=table", json={"value": i})
            assert r.status_code == 200, r.text
        def compacted() -> list[dict[str, object]]:
            return [r for r in job_runs.last_runs(Layout(data), job="compaction") if r["target"] == "ticks"]

        try:
            rows = eventually(compacted, 300, what="a scheduled compaction of 'ticks'", interval=2)
        except AssertionError:
            log = data / "_jobs" / "compaction.log"
            raise AssertionError(log.read_text()[-3000:] if log.exists() else "no compaction log") from None
        run = rows[-1]
        assert run["outcome"] == "ok" and run["trigger"] == "scheduler"
        assert run["files_before"] == 12 and run["files_after"] == 1
        metrics = httpx.get(url + "/metrics").text
        assert 'lakebroker_job_last_run_timestamp_seconds{job="compaction",outcome="ok"}' in metrics
        # The broker process itself never loaded a JVM: the job ran in its own process.
        assert server.proc is not None
        maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
        assert "libjvm" not in maps
        # And produce still works on the compacted table.
        assert httpx.post(url + "/v1/topics/ticks/messages?ack=table", json={"value": 99}).json()["offset"] == 12
    finally:
        server.stop()
