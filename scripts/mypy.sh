#!/usr/bin/env bash
# mypy over the installed layout. The stages live in top-level folders and install as `lakebroker.<stage>`
# (pyproject.toml's package-dir); mypy cannot follow setuptools' editable import hook, so it checks a
# tree of links that has the installed shape: .cache/typecheck/lakebroker/{cli.py,...,tables,...}.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TREE="$ROOT/.cache/typecheck"
rm -rf "$TREE"
mkdir -p "$TREE/lakebroker"
for entry in "$ROOT"/lakebroker/*; do
  [[ "$(basename "$entry")" == __pycache__ ]] || ln -s "$entry" "$TREE/lakebroker/"
done
"$ROOT/.venv/bin/python" - "$ROOT" "$TREE" <<'PY'
import os, sys, tomllib
root, tree = sys.argv[1:]
mapping = tomllib.load(open(f"{root}/pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"]
for package, folder in mapping.items():
    if package != "lakebroker":
        os.symlink(f"{root}/{folder}", f"{tree}/{package.replace('.', '/')}")
PY
ln -s "$ROOT/clients/python/lakebroker_client" "$TREE/lakebroker_client"
cd "$TREE"
exec "$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" lakebroker lakebroker_client
