"""Prints the README's configuration table from the Settings class (the one source of truth)."""

from __future__ import annotations

import contextlib

from tables.settings import PROJECT_ROOT, Settings


def rows() -> list[str]:
    out = ["| setting | environment variable | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if hasattr(default, "relative_to"):
            with contextlib.suppress(ValueError):
                default = default.relative_to(PROJECT_ROOT)
        out.append(f"| `{name}` | `LAKEBROKER_{name.upper()}` | `{default}` | {field.description or ''} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
