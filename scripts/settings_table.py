"""Prints the README's configuration table from the Settings class (the one source of truth)."""

from __future__ import annotations

import contextlib

from lakebroker.tables.settings import PROJECT_ROOT, Settings


def rows() -> list[str]:
    out = ["| setting | environment variable | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if hasattr(default, "relative_to"):
            with contextlib.suppress(ValueError):
                default = default.relative_to(PROJECT_ROOT)
        out.append(f"| `{name}` | `LAKEBROKER_{name.upper()}` | `{default}` | {field.description or ''} |")
    return out


def update_readme() -> None:
    """Rewrite the table between the README's settings markers."""
    readme = PROJECT_ROOT / "README.md"
    text = readme.read_text()
    start, end = "<!-- settings -->\n", "<!-- /settings -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(head + start + "\n".join(rows()) + "\n" + end + tail)


if __name__ == "__main__":
    update_readme()
