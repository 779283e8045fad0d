"""The one shared SparkSession of a pytest run (2 cores: one JVM at a time).

Conftests import `spark` from here; it is session-scoped, so every Spark test of a run shares one
JVM however many conftests expose it (getOrCreate returns the running session).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_pipeline.session import DEFAULT_JARS_DIR, build_spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = build_spark_session(master="local[2]", jars_dir=DEFAULT_JARS_DIR, app_name="lakebroker-tests",
                                  extra_conf={"spark.ui.showConsoleProgress": "false"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
