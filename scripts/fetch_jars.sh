#!/usr/bin/env bash
# Fetch the Delta jars (build/jars/pom.xml) and build the put-if-absent LogStores' jar into
# .cache/jars/, and Hadoop's S3A filesystem (build/jars/s3a/pom.xml) into .cache/jars/s3a/,
# so a Spark session starts with local jars only (no Ivy, no network).
# Idempotent: a no-op while the stamp matches the inputs. Works from any cwd.
# Env: PYTHON (default .venv/bin/python) is the interpreter whose pyspark is used.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-.venv/bin/python}"
case "$PYTHON" in
  */*) [[ "$PYTHON" = /* ]] || PYTHON="$ROOT/$PYTHON" ;;  # relative to the repo, not the cwd
esac

POM="$ROOT/build/jars/pom.xml"
S3A_POM="$ROOT/build/jars/s3a/pom.xml"
SRC_DIR="$ROOT/spark_pipeline/java"
OUT="$ROOT/.cache/jars"
M2="$ROOT/.cache/m2"
STAMP="$OUT/.stamp"

# Without importing pyspark (slow): its jars are what we compile against and must not clash with.
SPARK_JARS="$("$PYTHON" -c 'import importlib.util as u, os
s = u.find_spec("pyspark")
assert s and s.submodule_search_locations, "pyspark is not installed"
print(os.path.join(list(s.submodule_search_locations)[0], "jars"))')"
[[ -d "$SPARK_JARS" ]] || { echo "fetch_jars: no pyspark jars at $SPARK_JARS" >&2; exit 1; }

mapfile -t SOURCES < <(cd "$SRC_DIR" && find . -name '*.java' | LC_ALL=C sort)
HASH="$(
  {
    cat "$POM" "$S3A_POM" "${BASH_SOURCE[0]}"
    for s in "${SOURCES[@]}"; do echo "$s"; cat "$SRC_DIR/$s"; done
    ls "$SPARK_JARS"  # a pyspark upgrade must re-check overlaps and recompile
  } | sha256sum | cut -d' ' -f1
)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]]; then
  echo "fetch_jars: up to date ($OUT)"
  exit 0
fi

# Build into a scratch dir and swap it in at the end, so an interrupted run
# never leaves a half-filled .cache/jars behind a valid-looking state.
NEW="$ROOT/.cache/jars.new.$$"
trap 'rm -rf "$NEW"' EXIT
rm -rf "$NEW"
mkdir -p "$NEW/classes" "$M2"

echo "fetch_jars: resolving Delta jars with Maven (local repo $M2)"
if ! mvn -q -B -f "$POM" -Dmaven.repo.local="$M2" \
  dependency:copy-dependencies -DoutputDirectory="$NEW" >"$NEW/mvn.log" 2>&1; then
  cat "$NEW/mvn.log" >&2
  exit 1
fi
rm "$NEW/mvn.log"

# hadoop-aws must be the Hadoop version pyspark ships (hadoop-client-api-X.jar).
HADOOP_VERSION="$(basename "$(compgen -G "$SPARK_JARS/hadoop-client-api-[0-9]*.jar" | head -1)" .jar)"
HADOOP_VERSION="${HADOOP_VERSION#hadoop-client-api-}"
echo "fetch_jars: resolving hadoop-aws $HADOOP_VERSION (S3A) with Maven"
if ! mvn -q -B -f "$S3A_POM" -Dmaven.repo.local="$M2" -Dhadoop.version="$HADOOP_VERSION" \
  dependency:copy-dependencies -DoutputDirectory="$NEW/s3a" >"$NEW/mvn.log" 2>&1; then
  cat "$NEW/mvn.log" >&2
  exit 1
fi
rm "$NEW/mvn.log"

# The pom excludes what pyspark ships; fail loudly if a version bump brought a new overlap.
clash=0
for jar in "$NEW"/*.jar "$NEW"/s3a/*.jar; do
  name="$(basename "$jar")"
  artifact="$(sed -E 's/-[0-9].*$//' <<<"$name")"
  if compgen -G "$SPARK_JARS/$artifact-[0-9]*.jar" >/dev/null; then
    echo "fetch_jars: $name is also shipped by pyspark ($(basename "$(compgen -G "$SPARK_JARS/$artifact-[0-9]*.jar" | head -1)")); exclude it in $POM" >&2
    clash=1
  fi
done
(( clash == 0 )) || exit 1

echo "fetch_jars: compiling the LogStores"
CP="$(ls "$NEW"/delta-storage-*.jar):$(ls "$SPARK_JARS"/hadoop-client-api-*.jar | head -1):$(ls "$NEW"/s3a/hadoop-aws-*.jar)"
javac --release 17 -nowarn -cp "$CP" -d "$NEW/classes" "${SOURCES[@]/#/$SRC_DIR/}"
jar --create --file "$NEW/lakebroker-logstore.jar" -C "$NEW/classes" .
rm -rf "$NEW/classes"

echo "$HASH" >"$NEW/.stamp"
rm -rf "$OUT"
mv "$NEW" "$OUT"
trap - EXIT
echo "fetch_jars: $(ls "$OUT"/*.jar | wc -l) jars in $OUT, $(ls "$OUT"/s3a/*.jar | wc -l) in $OUT/s3a"
