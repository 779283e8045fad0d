#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it: lint, types, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/mypy tables ingest_api delivery_worker spark_pipeline lakebroker clients/python/lakebroker_client
mkdir -p test-artifacts
# Parallel processes (pytest-xdist), one module per process at a time: module-scoped servers
# start once. Most tests wait on servers, JVMs and disks, so more processes than cores pays.
# --no-loadscope-reorder: keep the collection order (longest modules first, tests/conftest.py);
# xdist would otherwise sort modules by their number of tests, and start a one-test Spark chain last.
.venv/bin/python -m pytest -p no:cacheprovider -q -n "${LAKEBROKER_TEST_PROCESSES:-4}" --dist loadfile \
  --no-loadscope-reorder "$@"
