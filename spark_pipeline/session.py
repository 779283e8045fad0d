"""The project's one SparkSession factory.

Delta Lake comes from jars that ``lakebroker spark setup`` (spark_setup.py) puts in the
per-user cache; nothing is resolved over the network when a session starts (no
``spark.jars.packages``/Ivy). Commits to ``file:`` tables go through
``AtomicLocalLogStore``, a put-if-absent LogStore, so Spark and delta-rs (which
commits with an atomic rename-no-replace) can both write the same table; commits to
``s3a://`` tables go through ``S3ConditionalLogStore`` (spark_pipeline/s3a.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lakebroker.spark_pipeline import s3a
from lakebroker.tables import user_cache
from lakebroker.tables.parquet_files import ROW_GROUP_BYTES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


LOGSTORE_CONF_KEY = "spark.delta.logStore.file.impl"
LOGSTORE_CLASS = "io.lakebroker.delta.AtomicLocalLogStore"

# Each glob must match at least one jar for the session to work.
_REQUIRED_JARS = ("delta-spark_*.jar", "delta-storage-*.jar", "lakebroker-logstore.jar")

_DELTA_DEFAULTS = "spark.databricks.delta.properties.defaults."

# Mostly static confs (fixed for the life of the JVM): they only apply to a fresh session.
_BASE_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    LOGSTORE_CONF_KEY: LOGSTORE_CLASS,
    # New tables stay on the plain reader 1 / writer 2 protocol that delta-rs creates too:
    # delta-rs also commits to these tables and must not meet table features it can't write.
    _DELTA_DEFAULTS + "enableDeletionVectors": "false",
    _DELTA_DEFAULTS + "enableRowTracking": "false",
    _DELTA_DEFAULTS + "enableInCommitTimestamps": "false",
    # (Liquid clustering has no default switch in OSS Delta: only an explicit CLUSTER BY.)
    # The py4j (classic) API, even if SPARK_API_MODE says otherwise: callers use the JVM.
    "spark.api.mode": "classic",
    "spark.ui.enabled": "false",
    # No console progress bars: job output is logs and one line of JSON (Airflow keeps the last line).
    "spark.ui.showConsoleProgress": "false",
    # Sized for a 2-core, 24 GB machine and small topic tables.
    "spark.driver.memory": "2g",
    "spark.driver.maxResultSize": "512m",
    "spark.sql.shuffle.partitions": "4",
    # Delta's snapshot state reconstruction defaults to 50 partitions: pure overhead here.
    "spark.databricks.delta.snapshotPartitions": "4",
    # Row groups a delivery read can skip (tables/parquet_files.py), not Parquet's 128 MB: every file
    # the jobs rewrite (compaction, key compaction, retention, replicas) is read by offset range.
    "spark.hadoop.parquet.block.size": str(ROW_GROUP_BYTES),
    "spark.sql.session.timeZone": "UTC",
    # Python workers must use this interpreter (the venv), not whatever python3 is on PATH.
    "spark.pyspark.python": sys.executable,
}


def jar_paths(jars_dir: Path) -> list[Path]:
    """The jars to put on Spark's classpath, or a RuntimeError naming the fix."""
    jars = sorted(jars_dir.glob("*.jar")) if jars_dir.is_dir() else []
    missing = [glob for glob in _REQUIRED_JARS if not any(j.match(glob) for j in jars)]
    if missing:
        raise RuntimeError(f"Delta jars not found in {jars_dir} (missing {', '.join(missing)}): run "
                           "`lakebroker spark setup`")
    return jars


def session_conf(jars_dir: Path) -> dict[str, str]:
    """Every conf a lakebroker session needs, including `spark.jars`: what `spark-submit` must be
    given as `--jars` / `--conf`, since its driver JVM is started before Python runs."""
    conf = dict(_BASE_CONF)
    conf["spark.jars"] = ",".join(str(p.resolve()) for p in jar_paths(jars_dir))
    conf.update(s3a.static_conf(jars_dir))
    return conf


def launched_by_spark_submit() -> bool:
    """True in the driver Python that spark-submit started: its JVM (and master) came first."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def use_class_archive() -> None:
    """Have the next driver JVM this process starts map the class archive, if there is one.

    The driver JVM is started by spark-submit, which takes JVM flags from SPARK_SUBMIT_OPTS."""
    archive = user_cache.class_archive()
    if os.environ.get("LAKEBROKER_SPARK_CLASS_ARCHIVE") == "off" or not archive.is_file():
        return
    flag = f"-XX:SharedArchiveFile={archive}"
    opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if flag not in opts:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{opts} {flag}".strip()


def build_spark_session(
    *,
    master: str = "local[*]",
    jars_dir: Path,
    app_name: str = "lakebroker",
    extra_conf: Mapping[str, str] | None = None,
    jvm_log: Path | None = None,
) -> SparkSession:
    """Start (or return the running) Delta-enabled SparkSession.

    ``extra_conf`` is applied last, so it may override the defaults above. With ``jvm_log``, a
    driver JVM started here writes its stdout and stderr to that file instead of this process's.
    Raises RuntimeError if a session not built here is already running, since its
    static conf (jars, LogStore) can no longer be changed.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession  # lazy: importing pyspark is slow and optional

    conf = session_conf(jars_dir)
    conf.update(extra_conf or {})
    use_class_archive()
    # PySpark starts its Python workers (UDFs, write_to_topic's senders) with PYSPARK_PYTHON, else
    # `python3` from the PATH, which may lack pyarrow and lakebroker; spark.pyspark.python is read by
    # spark-submit only.
    os.environ.setdefault("PYSPARK_PYTHON", conf.get("spark.pyspark.python", sys.executable))
    if jvm_log is not None and SparkContext._gateway is None and not launched_by_spark_submit():
        _start_driver_jvm(master, app_name, conf, jvm_log)

    builder = SparkSession.builder.appName(app_name)
    if not launched_by_spark_submit():  # else spark-submit's --master decides; a builder master would override it
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()

    actual = spark.sparkContext.getConf().get(LOGSTORE_CONF_KEY)
    if actual != conf[LOGSTORE_CONF_KEY]:
        raise RuntimeError(
            f"a SparkSession not built by build_spark_session is already running "
            f"({LOGSTORE_CONF_KEY}={actual!r}); stop it first"
        )
    s3a.configure(spark)
    return spark


def _start_driver_jvm(master: str, app_name: str, conf: Mapping[str, str], log: Path) -> None:
    """Start the driver JVM and its SparkContext with the JVM's stdout and stderr in `log`.

    A terminal would otherwise get the JVM's start-up chatter (module warnings, log4j's profile,
    "Setting default log level", the hostname warning), printed before any log level applies,
    and every Spark log line after it. pyspark's `launch_gateway` takes the Popen arguments."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    spark_conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(conf.items()))
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        try:
            gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": sink, "stderr": sink})  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 - the JVM's own words are in the log, not in exc
            lines = log.read_text(errors="replace").strip().splitlines()
            raise RuntimeError(f"the Spark driver JVM did not start ({lines[-1] if lines else exc}); "
                               f"its output is in {log}") from None
    SparkContext(conf=spark_conf, gateway=gateway)
