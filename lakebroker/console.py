"""Where the CLI's commands write: rich consoles for stdout and stderr, and tables of rows."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

# Piped output keeps every column whole instead of squeezing the table to 80 characters.
out = Console() if sys.stdout.isatty() else Console(width=100_000, soft_wrap=True)
err = Console(stderr=True)


def print_rows(columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(*columns, show_lines=False)
    for row in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    out.print(table)
