"""The wheel and sdist that `python -m build` makes work with no checkout beside them: installed with the
spark extra into a fresh venv outside the repository, `lakebroker spark setup` fills a per-user cache (the
poms and LogStore sources ship in the wheel), and `serve`, produce and a compaction run.
The wheel carries the dashboard's static files and the Airflow DAG file too.

Set-up here takes the path a machine without Maven takes, Spark's own resolver, offline against the
developer cache's Maven repository (which `make setup` filled with Maven), and must come out with the
same jars as Maven did: both resolvers are checked, and the test downloads nothing pip has not cached."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable

from lakebroker.tables import user_cache
from tests.test_install import clean_env, wait_for_server

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(900)]


def _build(tmp_path: Path) -> tuple[Path, Path]:
    """`python -m build` on a copy of the tracked files (the checkout stays untouched)."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "build", "--outdir", tmp_path / "dist", src],
                   check=True, capture_output=True, cwd=tmp_path)
    [wheel] = (tmp_path / "dist").glob("lakebroker-*.whl")
    [sdist] = (tmp_path / "dist").glob("lakebroker-*.tar.gz")
    return wheel, sdist


def test_the_wheel_serves_and_runs_spark_jobs_outside_the_checkout(tmp_path: Path) -> None:
    wheel, sdist = _build(tmp_path)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("lakebroker/airflow_dags/lakebroker_maintenance.py", "lakebroker/ingest_api/static/dashboard.html",
                   "lakebroker/spark_pipeline/maven/delta/pom.xml", "lakebroker/spark_pipeline/maven/s3a/pom.xml",
                   "lakebroker/spark_pipeline/java/io/lakebroker/delta/AtomicLocalLogStore.java"):
        assert needed in shipped, needed
    with tarfile.open(sdist) as archive:
        root = archive.getnames()[0].split("/")[0]
        assert f"{root}/spark_pipeline/maven/delta/pom.xml" in archive.getnames()

    venv, work = tmp_path / "venv", tmp_path / "elsewhere"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    cache = tmp_path / "cache"
    cache.mkdir()
    developer = user_cache.cache_dir()
    assert (developer / "jars" / ".stamp").is_file(), "make setup runs `lakebroker spark setup` (Maven) first"
    env = clean_env(LAKEBROKER_CACHE_DIR=str(cache), JAVA_HOME=os.environ.get("JAVA_HOME", ""))
    pip = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python"]
    subprocess.run([*pip, "install", "--quiet", "--no-compile", "-c", REPO / "requirements.lock", f"{wheel}[spark]"],
                   check=True, env=env, cwd=work)
    lakebroker = [str(venv / "bin" / "lakebroker"), "--data-dir", str(work / "data")]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*lakebroker, *args], env=env, cwd=work, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    missing = subprocess.run([*lakebroker, "sql", "SELECT 1"], env=env, cwd=work, capture_output=True, text=True,
                             timeout=600)
    assert missing.returncode == 1 and "run `lakebroker spark setup`" in missing.stderr, missing.stderr[-2000:]

    setup = run("spark", "setup", "--resolver", "spark", "--repositories", (developer / "m2").as_uri(),
                "--no-class-archive")  # the archive only speeds sessions up; make setup builds one
    assert "Spark's resolver" in setup.stdout and "compiling the LogStores" in setup.stdout
    jars = cache / "jars"
    assert (jars / "lakebroker-logstore.jar").is_file()
    for folder in (".", "s3a"):  # the same jars, under the same names, as Maven resolved
        assert {p.name for p in (jars / folder).glob("*.jar")} == {
            p.name for p in (developer / "jars" / folder).glob("*.jar")}, folder
    assert "up to date" in run("spark", "setup").stdout
    paths = run("spark", "paths").stdout
    assert f"jars: {jars}" in paths
    dags = Path(paths.split("airflow dags folder: ", 1)[1].strip())
    assert (dags / "lakebroker_maintenance.py").is_file() and str(dags).startswith(str(venv))

    log_path = work / "serve.log"
    with log_path.open("wb") as log:
        serve = subprocess.Popen([*lakebroker, "serve", "--port", "0"], stdout=log, stderr=subprocess.STDOUT,
                                 env={**env, "LAKEBROKER_COMPACTION_INTERVAL_S": "0"}, cwd=work)
    try:
        url = wait_for_server(serve, work / "data" / "server.json", log_path)
        assert "<html" in httpx.get(f"{url}/").text.lower()  # the dashboard, from the wheel's static files
        assert httpx.post(f"{url}/v1/topics", json={"name": "orders", "partitions": 2}).status_code == 201
        for n in range(3):  # three commits: something for compaction to merge
            r = httpx.post(f"{url}/v1/topics/orders/batch", params={"ack": "table"},
                           json={"messages": [{"key": f"k{i}", "value": {"n": n, "i": i}} for i in range(50)]})
            assert r.status_code == 200, r.text
    finally:
        serve.terminate()
        serve.wait(timeout=60)

    compact = run("compact", "orders").stdout
    assert ": ok" in compact and "6 → 2" in compact, compact  # two partitions, three commits each, one file each
    assert DeltaTable(str(work / "data" / "topics" / "orders")).to_pyarrow_table(columns=["offset"]).num_rows == 150
