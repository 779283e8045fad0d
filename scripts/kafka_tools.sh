#!/usr/bin/env bash
# Apache Kafka's broker and tools as jars from Maven Central (scripts/kafka/pom.xml), for the
# benchmark against a real Kafka broker and the tests that run Kafka's own Java tools; and Spark's
# Kafka connector (scripts/kafka/spark-connector-pom.xml) into .cache/kafka/spark-connector, for
# the test that reads and writes topics with it.
#
#   scripts/kafka_tools.sh build     # fetch them into .cache/kafka, once (skipped while the poms are unchanged)
#   scripts/kafka_tools.sh classpath # print the classpath (java -cp "$(scripts/kafka_tools.sh classpath)" ...)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/scripts/kafka/pom.xml"
SPARK_POM="$ROOT/scripts/kafka/spark-connector-pom.xml"
# The connector and what pyspark does not already ship (Scala, Hadoop, lz4 and snappy it has)
SPARK_JARS="spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2"
DEST="$ROOT/.cache/kafka"
STAMP="$DEST/jars.version"

build() {
  local want
  want="$(cat "$POM" "$SPARK_POM" "$0" | sha256sum | cut -d' ' -f1)"
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    touch "$STAMP"  # for make: up to date with the pom
    return 0
  fi
  command -v mvn >/dev/null || { echo "kafka_tools: Maven (mvn) is needed to fetch Kafka's jars" >&2; exit 1; }
  echo "kafka_tools: fetching Apache Kafka's jars from Maven Central (under a minute, once)" >&2
  # A scratch directory, then a rename: an interrupted fetch never leaves half a classpath.
  local tmp="$DEST/.jars.$$"
  trap 'rm -rf "$tmp"' RETURN
  # A Maven repository of its own, as `lakebroker spark setup` keeps: what Maven leaves in ~/.m2 (a
  # POM without its jar, from version mediation) breaks Spark's Ivy resolver, which reads ~/.m2 first.
  local repo="-Dmaven.repo.local=$DEST/m2"
  mvn -q -f "$POM" "$repo" dependency:copy-dependencies -DoutputDirectory="$tmp/jars" >&2
  mvn -q -f "$SPARK_POM" "$repo" dependency:copy-dependencies -DoutputDirectory="$tmp/spark-connector" \
    -DincludeArtifactIds="$SPARK_JARS" >&2
  rm -rf "$DEST/jars" "$DEST/spark-connector"
  mv "$tmp/jars" "$tmp/spark-connector" "$DEST/"
  echo "$want" >"$STAMP"
}

case "${1:-build}" in
  build) build ;;
  classpath) build; echo "$DEST/jars/*" ;;
  *) echo "usage: $0 [build|classpath]" >&2; exit 2 ;;
esac
