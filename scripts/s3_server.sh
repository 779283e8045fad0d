#!/usr/bin/env bash
# A local S3-compatible server (MinIO) for development, the tests and any check.
#
#   scripts/s3_server.sh build     # build .cache/bin/minio from its Go module, once (skipped when built)
#   scripts/s3_server.sh           # build if needed, then serve in the foreground (make s3-server)
#
# Serves on ${S3_HOST:-127.0.0.1}:${S3_PORT:-9000} (S3_HOST=0.0.0.0 in a container), data under ${S3_DATA_DIR:-.cache/s3-data}, with the
# credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY when set, else the local defaults
# lakebroker / lakebroker-secret. Creates the bucket ${S3_BUCKET:-lakebroker} if it is missing,
# then prints the endpoint. MinIO enforces If-None-Match on PUT, which the Delta commits rely on.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Pinned: a pseudo-version of github.com/minio/minio (MinIO publishes no semver module releases).
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"
BIN_DIR="$ROOT/.cache/bin"
MINIO="$BIN_DIR/minio"
STAMP="$BIN_DIR/minio.version"

build() {
  if [[ -x "$MINIO" && -f "$STAMP" && "$(cat "$STAMP")" == "$MINIO_VERSION" ]]; then
    touch "$STAMP"  # for make: up to date with this script
    return 0
  fi
  command -v go >/dev/null || { echo "s3_server: Go is needed to build MinIO (go install)" >&2; exit 1; }
  echo "s3_server: building MinIO $MINIO_VERSION with go install (about 10-15 minutes, once)" >&2
  mkdir -p "$BIN_DIR"
  # A scratch GOBIN, then a rename: an interrupted build never leaves a half-written binary.
  local tmp="$BIN_DIR/.build.$$"
  trap 'rm -rf "$tmp"' RETURN
  (cd "$BIN_DIR" && GOBIN="$tmp" GOFLAGS=-mod=mod go install "github.com/minio/minio@$MINIO_VERSION")
  mv "$tmp/minio" "$MINIO"
  echo "$MINIO_VERSION" >"$STAMP"
}

serve() {
  build
  local host="${S3_HOST:-127.0.0.1}" port="${S3_PORT:-9000}" bucket="${S3_BUCKET:-lakebroker}"
  local data="${S3_DATA_DIR:-$ROOT/.cache/s3-data}"
  local user="${AWS_ACCESS_KEY_ID:-lakebroker}" secret="${AWS_SECRET_ACCESS_KEY:-lakebroker-secret}"
  local endpoint="http://127.0.0.1:$port"
  mkdir -p "$data"
  MINIO_ROOT_USER="$user" MINIO_ROOT_PASSWORD="$secret" MINIO_BROWSER=off MINIO_UPDATE=off \
    "$MINIO" server --quiet --address "$host:$port" "$data" &
  MINIO_PID=$!
  trap 'kill "$MINIO_PID" 2>/dev/null; wait "$MINIO_PID" 2>/dev/null' EXIT INT TERM
  local status=""
  for _ in $(seq 1 300); do
    if curl -fsS "$endpoint/minio/health/ready" >/dev/null 2>&1; then
      # Create the bucket over the S3 API: 200 made it, 409 it exists (a data dir that predates
      # it). MinIO can report ready and still refuse a write for a moment (seen beside a busy
      # test suite), so anything else is retried, and the endpoint is announced only with the bucket.
      status=$(curl -sS -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:${AWS_REGION:-us-east-1}:s3" \
        --user "$user:$secret" -X PUT "$endpoint/$bucket" 2>/dev/null || true)
      if [ "$status" = 200 ] || [ "$status" = 409 ]; then
        echo "S3 endpoint: $endpoint (bucket $bucket, AWS_ENDPOINT_URL=$endpoint)"
        wait "$MINIO_PID"
        return
      fi
    fi
    kill -0 "$MINIO_PID" 2>/dev/null || { echo "s3_server: MinIO exited" >&2; exit 1; }
    sleep 0.1
  done
  echo "s3_server: MinIO on $endpoint did not become ready with bucket $bucket (last answer to creating it: ${status:-none})" >&2
  exit 1
}

case "${1:-serve}" in
  build) build ;;
  serve) serve ;;
  *) echo "usage: $0 [build|serve]" >&2; exit 2 ;;
esac
