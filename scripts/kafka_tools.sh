#!/usr/bin/env bash
# Apache Kafka's broker and tools as jars from Maven Central (scripts/kafka/pom.xml), for the
# benchmark against a real Kafka broker and the tests that run Kafka's own Java tools.
#
#   scripts/kafka_tools.sh build     # fetch them into .cache/kafka/jars, once (skipped while the pom is unchanged)
#   scripts/kafka_tools.sh classpath # print the classpath (java -cp "$(scripts/kafka_tools.sh classpath)" ...)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/scripts/kafka/pom.xml"
DEST="$ROOT/.cache/kafka"
STAMP="$DEST/jars.version"

build() {
  local want
  want="$(sha256sum "$POM" | cut -d' ' -f1)"
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    touch "$STAMP"  # for make: up to date with the pom
    return 0
  fi
  command -v mvn >/dev/null || { echo "kafka_tools: Maven (mvn) is needed to fetch Kafka's jars" >&2; exit 1; }
  echo "kafka_tools: fetching Apache Kafka's jars from Maven Central (under a minute, once)" >&2
  # A scratch directory, then a rename: an interrupted fetch never leaves half a classpath.
  local tmp="$DEST/.jars.$$"
  trap 'rm -rf "$tmp"' RETURN
  mvn -q -f "$POM" dependency:copy-dependencies -DoutputDirectory="$tmp" >&2
  rm -rf "$DEST/jars"
  mv "$tmp" "$DEST/jars"
  echo "$want" >"$STAMP"
}

case "${1:-build}" in
  build) build ;;
  classpath) build; echo "$DEST/jars/*" ;;
  *) echo "usage: $0 [build|classpath]" >&2; exit 2 ;;
esac
