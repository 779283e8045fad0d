"""The one shared SparkSession of a pytest run (2 cores: one JVM at a time).

Conftests import `spark` from here; it is session-scoped, so every Spark test of a run shares one
JVM however many conftests expose it (getOrCreate returns the running session).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from lakebroker.spark_pipeline.session import build_spark_session
from lakebroker.tables.settings import Settings
from lakebroker.tables.user_cache import jars_dir


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # scripts/test.sh gives short-lived job JVMs C1-only flags; this one lives the whole run and
    # does most of the Spark work, where C2 pays (a C1-only session made test_replication 5 min vs 3).
    submit_opts = os.environ.get("SPARK_SUBMIT_OPTS")
    job_flags = os.environ.get("LAKEBROKER_TEST_JOB_JVM_OPTS", "")
    session_flags = os.environ.get("LAKEBROKER_TEST_SESSION_JVM_OPTS", "")
    if submit_opts is not None and (job_flags or session_flags):
        os.environ["SPARK_SUBMIT_OPTS"] = f"{submit_opts.replace(job_flags, '')} {session_flags}".strip()
    try:
        # (local[2, 2]: a failed task is run again once, as a cluster would, up to spark.task.maxFailures)
        session = build_spark_session(master="local[2, 2]", jars_dir=jars_dir(), app_name="lakebroker-tests",
                                      extra_conf={"spark.ui.showConsoleProgress": "false", **Settings().spark_conf})
    finally:
        if submit_opts is not None:
            os.environ["SPARK_SUBMIT_OPTS"] = submit_opts
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
