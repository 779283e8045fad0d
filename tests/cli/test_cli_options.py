"""Conventional command-line behaviour: `--version`, and choice options that list their values."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lakebroker import cli

cli._register_plugins()
runner = CliRunner()

# Every option with a fixed set of values: (command, option, its values).
CHOICES = [
    (["serve"], "--auth", ["auto", "required", "off"]),
    (["topics", "create"], "--cleanup-policy", ["delete", "compact"]),
    (["produce"], "--ack", ["none", "wal", "table"]),
    (["sql"], "--format", ["table", "csv", "json"]),
    (["spark", "setup"], "--resolver", ["auto", "maven", "spark"]),
    (["tokens", "create"], "--scope", ["produce", "consume", "metrics", "admin"]),
    (["job-runs"], "--job", ["compaction", "retention", "key-compaction", "offsets-compaction", "replication"]),
]


def test_version_prints_and_exits_zero() -> None:
    done = subprocess.run([sys.executable, "-m", "lakebroker", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"lakebroker {version('lakebroker')}\n"
    # the installed metadata is the project's own version (a stale editable install would differ)
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert version("lakebroker") == pyproject["project"]["version"]


@pytest.mark.parametrize(("command", "option", "values"), CHOICES, ids=[c[1] for c in CHOICES])
def test_help_lists_the_values_and_a_bad_one_is_refused(command: list[str], option: str, values: list[str]) -> None:
    shown = runner.invoke(cli.app, [*command, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0
    line = next(line for line in shown.output.splitlines() if option in line)
    assert "|".join(values) in line, line

    args = [*command, "x", "y"] if command == ["produce"] else [*command, "x"] if command[-1] in ("create", "sql") \
        else command
    refused = runner.invoke(cli.app, [*args, option, "bogus"], env={"COLUMNS": "200"})
    assert refused.exit_code == 2
    assert f"Invalid value for '{option}'" in refused.output
    assert "'bogus' is not one of " + ", ".join(f"'{v}'" for v in values) in refused.output
