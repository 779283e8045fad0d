#!/bin/sh
# Token bootstrap of docker-compose.yml: the first admin API token of a deployment.
#
# `lakebroker tokens create` writes to the data dir's _system/tokens table (it needs the data
# dir, not a token), so this runs once, before anything needs a token, and writes the token to
# TOKEN_FILE (default /secrets/admin.token, mode 600). If the file exists it is kept: re-running
# never mints a second admin token. Mint narrower tokens with this one's holder's help:
#   docker compose exec broker lakebroker tokens create --scope produce --topic 'orders*'
set -eu
TOKEN_FILE="${TOKEN_FILE:-/secrets/admin.token}"
if [ -s "$TOKEN_FILE" ]; then
  echo "bootstrap: $TOKEN_FILE exists; keeping it"
  exit 0
fi
umask 077
lakebroker tokens create --scope admin --name "${TOKEN_NAME:-compose-admin}" > "$TOKEN_FILE.tmp"
mv "$TOKEN_FILE.tmp" "$TOKEN_FILE"
echo "bootstrap: admin token written to $TOKEN_FILE"
