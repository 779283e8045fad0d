#!/usr/bin/env bash
# The layer contracts in pyproject.toml ([tool.importlinter]), checked by import-linter over the
# installed layout (scripts/installed_tree.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/installed_tree.sh"
cd "$TREE"
PYTHONPATH="$TREE" "$ROOT/.venv/bin/lint-imports" --config "$ROOT/pyproject.toml" --no-cache
