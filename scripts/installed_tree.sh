# Sourced by scripts/mypy.sh and scripts/import_contracts.sh: a tree of links with the installed
# shape of the package (lakebroker/{cli.py,...,tables,...}), in a fresh directory, as $TREE. The
# stages live in top-level folders and install as `lakebroker.<stage>` (pyproject.toml's
# package-dir); mypy and import-linter cannot follow setuptools' editable import hook.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$ROOT/.cache"
TREE="$(mktemp -d "$ROOT/.cache/installed-tree.XXXXXX")"
trap 'rm -rf "$TREE"' EXIT
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
ln -s "$ROOT/bench" "$TREE/bench"
ln -s "$ROOT/scripts" "$TREE/scripts"
