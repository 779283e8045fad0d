# The two commands a person needs: `make run` and `make test`. Both set everything up first.
# Setup is idempotent: each step is skipped while its inputs are unchanged. `make run` installs
# what the broker needs (the runtime dependencies and the spark extra, for the scheduled jobs);
# `make test` (and lint, bench, fault, soak) installs the dev extra: that, plus Airflow, the test tools
# and the documentation site's builder.

PYTHON_BIN ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test setup setup-run lint bench bench-quick fault soak soak-cluster s3-server clean

run: setup-run
	$(VENV)/bin/lakebroker serve

test: setup
	bash scripts/test.sh

setup-run: $(RUN_STAMP)
	$(VENV)/bin/lakebroker spark setup

# The dev install first: it holds the spark extra, so the run stamp then needs no install of its own.
setup: $(DEV_STAMP) setup-run .cache/bin/minio.version .cache/kafka/jars.version

# Every version, transitive ones too, is pinned in requirements.lock.
# The client too: lakebroker.spark.write_to_topic's Spark tasks send with it.
$(RUN_STAMP): pyproject.toml requirements.lock clients/python/pyproject.toml
	test -x $(PY) || $(PYTHON_BIN) -m venv $(VENV)
	if [ $(DEV_STAMP) -nt pyproject.toml ] && [ $(DEV_STAMP) -nt requirements.lock ]; then :; else \
	  $(PY) -m pip install --quiet --upgrade pip && \
	  $(PY) -m pip install --quiet -c requirements.lock -e ".[spark]" -e "./clients/python[arrow]"; fi
	touch $(RUN_STAMP)

# The Python client is its own distribution (clients/python), installed beside the broker for the tests.
$(DEV_STAMP): pyproject.toml requirements.lock clients/python/pyproject.toml
	test -x $(PY) || $(PYTHON_BIN) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e ".[dev]" -e ./clients/python
	touch $(DEV_STAMP)

# The local S3-compatible server (MinIO, built once from its Go module) the tests and `make s3-server` run.
.cache/bin/minio.version: scripts/s3_server.sh
	bash scripts/s3_server.sh build

# Apache Kafka's broker and Java tools (jars from Maven Central): the Kafka benchmark's reference broker and
# the tests that run Kafka's own clients against the listener.
.cache/kafka/jars.version: scripts/kafka/pom.xml scripts/kafka/spark-connector-pom.xml scripts/kafka_tools.sh
	bash scripts/kafka_tools.sh build

# MinIO on 127.0.0.1:$${S3_PORT:-9000}, in the foreground; creates the bucket `lakebroker`, prints the endpoint.
s3-server:
	bash scripts/s3_server.sh serve

lint: setup
	$(VENV)/bin/ruff check .
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	bash scripts/import_contracts.sh
	bash scripts/mypy.sh

bench: setup
	$(PY) -m bench.run

bench-quick: setup
	$(PY) -m bench.run --quick

# The fault-injection suite's long form: 20 crash cycles, then its figures for docs/benchmarks.md.
fault: setup
	LAKEBROKER_CRASH_CYCLES=20 $(PY) -m pytest -p no:cacheprovider -q -m fault
	$(PY) -m bench.run --only faults

# Ten minutes of mixed load with SIGKILLs, topic churn, Spark jobs and a failing receiver; then every
# message is accounted for. Writes bench/results/soak.json and renders docs/benchmarks.md again.
soak: setup
	$(PY) -m bench.soak --minutes 10 $(SOAK_ARGS)

# The same on three nodes sharing a table root on the local S3 server, under a nemesis drawn from a seed (bench/soak/nemesis.py):
# 30 faults, five of each kind: SIGKILL, SIGSTOP past the lease TTL, a clock off, a leave and join, a partition
# moved back and forth, a topic re-created; also bounds each partition's outage after its owner's death.
soak-cluster: setup
	$(PY) -m bench.soak --minutes 10 --nodes 3 $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .cache data
