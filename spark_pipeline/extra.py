"""Whether the `spark` extra is installed.

pyspark and delta-spark (~450 MB with the JVM side) are not runtime dependencies: `pip install
lakebroker` serves, delivers and answers every HTTP route without them. The maintenance jobs and
`lakebroker sql` need them; without them `serve` schedules no job (and says so), and a command
that needs Spark stops with `missing_spark_message`.
"""

from __future__ import annotations

import importlib.util

SPARK_MODULES = frozenset({"pyspark", "delta", "py4j"})  # what the spark extra installs
INSTALL_HINT = "pip install 'lakebroker[spark]'"


def spark_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("pyspark", "delta"))


def missing_spark_message(what: str) -> str:
    return f"{what} needs Spark, and pyspark is not installed: {INSTALL_HINT} (or `make run`, which installs it)"
