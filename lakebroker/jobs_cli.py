"""CLI commands of the Spark maintenance jobs (compact, retention, replicate, ...)."""

from __future__ import annotations

from collections.abc import Callable

import typer

from tables.settings import Settings


def register(app: typer.Typer, settings: Callable[[], Settings], fail: Callable[[str, int], typer.Exit]) -> None:
    """Add the job commands to the `lakebroker` app."""
