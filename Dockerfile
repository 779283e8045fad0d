# syntax=docker/dockerfile:1
# The project image (target `lakebroker`): the broker, the delivery workers, the Spark master and
# worker (spark-class from pyspark), the demo receiver and the set-up jobs of docker-compose.yml.
# Target `airflow`: the official Airflow image plus this project, for the scheduler, DAG processor
# and API server (the DAGs call into spark_pipeline, so Airflow's interpreter must import it).
# Target `s3`: the S3-compatible server the tables live on (MinIO, built by scripts/s3_server.sh
# from its Go module at the version the tests use).
#
# Set-up mirrors `make setup`: dependencies pinned by requirements.lock, then `lakebroker spark setup`
# resolves the Delta jars with Maven and compiles the atomic LogStore into /app/.cache/jars.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
ARG GO_IMAGE=golang:1.26-bookworm

# -- build: JDK and Maven only here -------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# Runtime dependencies and the spark extra first, so this layer is cached while pyproject.toml and the
# lock are unchanged.
COPY pyproject.toml requirements.lock ./
RUN python -m venv /opt/venv \
 && python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['spark']))" > /tmp/deps.txt \
 && pip install --no-cache-dir -c requirements.lock -r /tmp/deps.txt
COPY . .
RUN pip install --no-cache-dir --no-deps -e . \
 && pip install --no-cache-dir -c requirements.lock -e ./clients/python \
 && LAKEBROKER_CACHE_DIR=/app/.cache lakebroker spark setup --no-class-archive \
 && rm -rf .cache/m2

# -- lakebroker: JRE, venv, source and jars ----------------------------------------------------
FROM ${PYTHON_IMAGE} AS lakebroker
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 --gid 0 lakebroker \
 && mkdir -p /data /secrets \
 && chown 1000:0 /data /secrets && chmod 2770 /data /secrets
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    LAKEBROKER_DATA_DIR=/data LAKEBROKER_JARS_DIR=/app/.cache/jars
WORKDIR /app
USER 1000:0
EXPOSE 8080
CMD ["lakebroker", "serve", "--host", "0.0.0.0"]

# -- airflow: the official image plus the project ----------------------------------------------
FROM ${AIRFLOW_IMAGE} AS airflow
USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build --chown=airflow:0 /app /app
USER airflow
# Airflow stays at the image's version; everything else is pinned by the project's lock.
RUN pip install --no-cache-dir -c /app/requirements.lock "apache-airflow==${AIRFLOW_VERSION}" \
        apache-airflow-providers-apache-spark pyspark-client -e "/app[spark]"
ENV LAKEBROKER_DATA_DIR=/data LAKEBROKER_JARS_DIR=/app/.cache/jars

# -- s3: MinIO, the same build and script as `make s3-server` and the tests -------------------------
FROM ${GO_IMAGE} AS s3-build
WORKDIR /app
COPY scripts/s3_server.sh scripts/s3_server.sh
RUN bash scripts/s3_server.sh build

FROM ${PYTHON_IMAGE} AS s3
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /s3-data && chown 1000:0 /s3-data
COPY --from=s3-build /app/.cache/bin /app/.cache/bin
COPY scripts/s3_server.sh /app/scripts/s3_server.sh
WORKDIR /app
ENV S3_HOST=0.0.0.0 S3_PORT=9000 S3_DATA_DIR=/s3-data
USER 1000:0
EXPOSE 9000
CMD ["bash", "/app/scripts/s3_server.sh", "serve"]
