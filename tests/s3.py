"""A real S3-compatible server (MinIO, `scripts/s3_server.sh`) on loopback, one per test process.

`make test` builds the binary (`make setup`); the fixture starts it on a free port with its data
under the session's tmp dir and points the AWS_* environment of this process at it; every test
gets a prefix of its own in the bucket `lakebroker`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from scripts.s3_process import S3Process, start

# Distinctive, so a test can search every response and log line for them.
ACCESS_KEY = "lbtest-access-AKIA7Q"
SECRET_KEY = "lbtest-secret-Zx81pQ-never-shown"

S3Server = S3Process


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Process]:
    server = start(tmp_path_factory.mktemp("s3"), ACCESS_KEY, SECRET_KEY)
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)  # delta-rs, pyarrow and Spark (tables/storage.py) read these
    try:
        yield server
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


@pytest.fixture
def s3_root(s3_server: S3Process) -> str:
    return s3_server.uri()


@pytest.fixture
def s3_spark(spark: Any, s3_server: S3Process) -> Any:
    """The shared Spark session, its S3A pointed at this process's server."""
    from lakebroker.spark_pipeline import s3a

    s3a.configure(spark)
    return spark
