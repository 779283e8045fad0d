"""The JVM class-data archive (AppCDS) that makes a Spark session start faster.

A Spark driver JVM loads some 20,000 classes at start. `lakebroker spark setup` runs one small Delta
workload with `-XX:ArchiveClassesAtExit`, and every later driver JVM maps the archive instead
of parsing those classes again (spark_pipeline/session.py adds `-XX:SharedArchiveFile`). On a
2-core machine that cuts about a third off a session's start. A stale or foreign archive (another
JDK, another pyspark) is ignored by the JVM, silently, so the archive is only ever a speed-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lakebroker.spark_pipeline.session import build_spark_session
from lakebroker.tables import user_cache


def _workload(jars: Path) -> None:
    """What a lakebroker job does, so the classes it needs are the ones archived."""
    spark = build_spark_session(master="local[1]", jars_dir=jars, app_name="lakebroker-class-archive")
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/t"
        spark.range(100).selectExpr("cast(id % 2 as int) AS partition", "id AS offset").write.format("delta") \
            .partitionBy("partition").save(path)
        spark.sql(f"OPTIMIZE delta.`{path}`").collect()
        spark.sql(f"DELETE FROM delta.`{path}` WHERE offset < 10").collect()
        spark.read.format("delta").load(path).groupBy("partition").count().collect()
    spark.stop()


def build(jars: Path, archive: Path | None = None) -> Path:
    """(Re)build the archive from a workload in a child process; whole or not at all."""
    archive = archive or user_cache.class_archive()
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    env = {**os.environ, "LAKEBROKER_SPARK_CLASS_ARCHIVE": "off",
           "SPARK_SUBMIT_OPTS": f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} -XX:ArchiveClassesAtExit={partial}"}
    done = subprocess.run([sys.executable, "-m", "lakebroker.spark_pipeline.class_archive", str(jars)], env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not partial.exists():
        raise RuntimeError(f"could not build the JVM class archive:\n{done.stderr[-3000:]}")
    partial.replace(archive)
    return archive


if __name__ == "__main__":  # the workload, in the child process `build` starts
    _workload(Path(sys.argv[1]))
