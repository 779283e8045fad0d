#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it: lint, the layer contracts, the documentation
# site, types, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
# The site, strictly (mkdocs.yml): a page missing from the nav, a broken link or anchor fails. Seconds.
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --quiet
scripts/import_contracts.sh
mkdir -p test-artifacts
# mypy (about 12 CPU-s on a fresh clone, one core) runs beside pytest's start-up; its verdict counts all the same.
scripts/mypy.sh \
  >test-artifacts/mypy.log 2>&1 &
mypy_pid=$!
# The suite starts ~40 short-lived Spark JVMs (CLI jobs, Airflow tasks, serve's scheduler). For a
# JVM that lives a minute, C2 compilation and G1's threads cost more than they return: C1 only and
# the serial collector halve their CPU (measured: `lakebroker compact` 35 -> 17 CPU-s). The shared
# in-process session JVM, which lives the whole run, keeps the defaults (tests/spark_fixtures.py).
export SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:-} ${LAKEBROKER_TEST_JOB_JVM_OPTS:=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"
export LAKEBROKER_TEST_JOB_JVM_OPTS
# The shared in-process session lives the whole run (tests/spark_fixtures.py): C2 pays there, but
# on every warm method it would compile; a higher threshold compiles only the hot ones.
export LAKEBROKER_TEST_SESSION_JVM_OPTS="${LAKEBROKER_TEST_SESSION_JVM_OPTS:--XX:CompileThresholdScaling=4 -XX:+UseSerialGC}"
# Spark's test settings for tables of a few files: one task per stage, not one per core; and
# interpreted expressions instead of generated code (the mode Spark's own test suites also run in),
# since compiling a query's code with Janino costs more than running it over a few hundred rows
# (measured: test_replication 166 -> 126 CPU-s, `lakebroker compact` 12.7 -> 11.2).
test_conf='{"spark.sql.shuffle.partitions": "1", "spark.default.parallelism": "1", "spark.databricks.delta.snapshotPartitions": "1", "spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}'
export LAKEBROKER_SPARK_CONF="${LAKEBROKER_SPARK_CONF:-$test_conf}"
# Parallel processes (pytest-xdist), one module per process at a time: module-scoped servers
# start once. Most tests wait on servers, JVMs and disks, so more processes than cores pays.
# --no-loadscope-reorder: keep the collection order (longest modules first, tests/conftest.py);
# xdist would otherwise sort modules by their number of tests, and start a one-test Spark chain last.
# --durations: the slowest tests, so a CI log says where the suite's time went.
status=0
.venv/bin/python -m pytest -p no:cacheprovider -q -n "${LAKEBROKER_TEST_PROCESSES:-4}" --dist loadfile \
  --no-loadscope-reorder --durations=25 "$@" || status=$?
if ! wait "$mypy_pid"; then
  cat test-artifacts/mypy.log
  echo "mypy failed" >&2
  exit 1
fi
tail -n 1 test-artifacts/mypy.log
exit "$status"
