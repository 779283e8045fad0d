"""Writes the settings table of docs/configuration.md from the Settings class (the one source of truth).

`python -m scripts.settings_table` rewrites the table between the page's settings markers;
`--check` only compares, and exits 1 if the page is out of date."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from lakebroker.tables.settings import PROJECT_ROOT, Settings

# The page beside this script, not PROJECT_ROOT's: the checkout the script runs from.
PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
START, END = "<!-- settings -->\n", "<!-- /settings -->"


def rows() -> list[str]:
    out = ["| setting | environment variable | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if hasattr(default, "relative_to"):
            with contextlib.suppress(ValueError):
                default = default.relative_to(PROJECT_ROOT)
        out.append(f"| `{name}` | `LAKEBROKER_{name.upper()}` | `{default}` | {field.description or ''} |")
    return out


def rendered(text: str) -> str:
    """The page's text with the table between its settings markers made from the code."""
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + START + "\n".join(rows()) + "\n" + END + tail


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    if "--check" in argv:
        if rendered(text) != text:
            print(f"{PAGE}: the settings table is out of date; run python -m scripts.settings_table", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(rendered(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
