"""Compaction on a real Spark standalone cluster (master + 1-core worker on loopback), via spark-submit.

Runs without the shared in-process session: the driver is spark-submit's, the work happens in the
worker's executor, which gets the Delta jars through spark.jars.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakebroker.spark_pipeline.scheduler import job_env, spark_home, spark_submit_command
from lakebroker.tables import job_runs
from lakebroker.tables.job_runs import JobName
from lakebroker.tables.layout import Layout
from tests.servers import free_port
from tests.spark_pipeline.topics import create_topic, file_count, log_ends, offsets_by_partition, produce, settings_for
from tests.waiting import eventually

pytestmark = [pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _wait_for(log: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    def logged() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}: {log.read_text()[-3000:]}")
        return log.exists() and needle in log.read_text()

    eventually(logged, timeout, what=f"{needle!r} in {log}", interval=0.5)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    home = spark_home()
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(tmp_path / "logs"), "SPARK_WORKER_DIR": str(tmp_path / "work"),
           "SPARK_DAEMON_MEMORY": "256m"}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master_log = tmp_path / "master.log"
        with master_log.open("wb") as out:
            procs.append(subprocess.Popen(
                [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(free_port())],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _wait_for(master_log, "I have been elected leader", procs[0], 120)
        worker_log = tmp_path / "worker.log"
        with worker_log.open("wb") as out:
            procs.append(subprocess.Popen(
                [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "768m", "--webui-port", str(free_port()),
                 "--work-dir", str(tmp_path / "work"), url],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _wait_for(worker_log, "Successfully registered with master", procs[1], 120)
        yield url
    finally:
        for proc in reversed(procs):  # only the processes this fixture started, by pid
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_compaction_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data", spark_master=cluster, spark_driver_memory="512m",
                            compaction_target_file_bytes=1_000_000)
    create_topic(settings, "clustered", partitions=2)
    for i in range(10):
        produce(settings, "clustered", i % 2, 20)
    ends = log_ends(settings, "clustered", 2)
    before = offsets_by_partition(settings, "clustered")
    argv = spark_submit_command(JobName.COMPACTION, settings, topic="clustered", extra_conf={
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m", "spark.cores.max": "1", "spark.ui.showConsoleProgress": "false"})
    env = {**job_env(settings), "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    # spark-submit merges the job's stderr into its stdout: the result is the line of JSON.
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith('{"job"')))
    assert result["outcome"] == "ok" and result["trigger"] == "spark-submit"
    (table,) = result["tables"]
    assert table["files_before"] == 10 and table["files_after"] == 2
    assert file_count(settings, "clustered") == 2
    assert offsets_by_partition(settings, "clustered") == before
    assert log_ends(settings, "clustered", 2) == ends
    (row,) = job_runs.last_runs(Layout(settings.data_dir), job="compaction")
    assert row["trigger"] == "spark-submit" and row["outcome"] == "ok"
    # The work ran in an executor the worker launched for this application.
    executor_logs = list((tmp_path / "work").glob("app-*/*/stderr"))
    assert executor_logs, "no executor was launched on the worker"
