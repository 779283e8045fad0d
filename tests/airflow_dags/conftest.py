"""Airflow for these tests only: a temporary AIRFLOW_HOME (sqlite), migrated once, with the DAGs
folder pointing at airflow_dags/. The environment is set here, before any test imports Airflow
(the tests import it lazily), so Airflow's configuration never leaks into other test packages."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOME = Path(tempfile.mkdtemp(prefix="lakebroker-airflow-"))
os.environ.update({
    "AIRFLOW_HOME": str(HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "airflow_dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{HOME / 'airflow.db'}",
})


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[Path]:
    airflow = Path(sys.executable).parent / "airflow"
    done = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True, timeout=600,
                          env=os.environ.copy())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    yield HOME
