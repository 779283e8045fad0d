"""Spark on S3: Hadoop's S3A filesystem and the put-if-absent LogStore for `s3a://` tables.

The table root and replicas may be `s3://bucket/prefix`; Spark reaches them as `s3a://`
(lakebroker.tables.storage.spark_uri). The S3A jars (hadoop-aws at pyspark's Hadoop version and the AWS SDK
bundle, `<cache>/jars/s3a`, `lakebroker spark setup`) go on the driver's and executors' class path.

Delta commits to `s3a://` (and `s3://`) tables go through S3ConditionalLogStore: each commit is a
PUT with `If-None-Match: *`, so Spark and delta-rs (conditional put too, tables/storage.py) can
both commit to one table without a lock service.

Endpoint, region and credentials come from the AWS_* environment when a session is built or
reused (`configure`): they are set on the running session's Hadoop configuration, never on the
spark-submit command line, and a JVM started before they were set still gets them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lakebroker.tables.storage import S3Endpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

S3_LOGSTORE_CLASS = "io.lakebroker.delta.S3ConditionalLogStore"


def s3a_jars(jars_dir: Path) -> list[Path]:
    folder = jars_dir / "s3a"
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not any(j.name.startswith("hadoop-aws-") for j in jars):
        raise RuntimeError(f"S3A jars not found in {folder}: run `lakebroker spark setup`")
    return jars


def static_conf(jars_dir: Path) -> dict[str, str]:
    """Confs fixed at JVM start: the class path and the LogStore of each S3 scheme."""
    classpath = ":".join(str(p.resolve()) for p in s3a_jars(jars_dir))
    return {
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
        "spark.delta.logStore.s3a.impl": S3_LOGSTORE_CLASS,
        "spark.delta.logStore.s3.impl": S3_LOGSTORE_CLASS,
    }


def hadoop_conf(s3: S3Endpoint) -> dict[str, str]:
    """S3A settings for this endpoint (secrets included: they go only into the JVM's memory)."""
    conf = {
        "fs.s3a.endpoint.region": s3.region,
        # Commit files are created with If-None-Match: * (S3ConditionalLogStore); on by default in
        # Hadoop 3.5, set here so a site config cannot turn it off underneath the LogStore.
        "fs.s3a.create.conditional.enabled": "true",
        # Fail fast on a dead endpoint instead of S3A's default of minutes of retries.
        "fs.s3a.attempts.maximum": "3",
        "fs.s3a.retry.limit": "3",
    }
    if s3.endpoint:
        conf.update({
            "fs.s3a.endpoint": s3.endpoint,
            "fs.s3a.path.style.access": "true",  # MinIO and most S3-compatible servers
            "fs.s3a.connection.ssl.enabled": "false" if s3.plain_http else "true",
        })
    if s3.access_key and s3.secret_key:
        conf["fs.s3a.access.key"] = s3.access_key
        conf["fs.s3a.secret.key"] = s3.secret_key
        if s3.session_token:
            conf["fs.s3a.session.token"] = s3.session_token
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return conf


def configure(spark: SparkSession, s3: S3Endpoint | None = None) -> None:
    """Point the session's S3A at the endpoint and credentials of the environment (or `s3`).

    S3A caches a filesystem per bucket, so a change after first use needs a new JVM."""
    target = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in hadoop_conf(s3 or S3Endpoint.from_env()).items():
        target.set(key, value)
