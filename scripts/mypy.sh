#!/usr/bin/env bash
# mypy over the installed layout (scripts/installed_tree.sh), and the benchmarks and scripts beside it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/installed_tree.sh"
cd "$TREE"
"$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" lakebroker lakebroker_client bench scripts
