"""docs/*.md stay true to the code where they list what the code defines: offset reasons, the
jobs' command lines, and what replication copies. (The SQL of docs/analysts.md runs in
tests/spark_pipeline/test_analysts.py; the README in tests/test_readme.py.)"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from lakebroker.tables.job_runs import JobName
from lakebroker.tables.offsets import OffsetReason

DOCS = Path(__file__).resolve().parent.parent / "docs"
ANALYSTS = (DOCS / "analysts.md").read_text()
OPERATIONS = (DOCS / "operations.md").read_text()


def test_analysts_lists_every_offset_reason() -> None:
    table = ANALYSTS.split("| reason | written when |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([a-z-]+)` \|", table, flags=re.M)
    assert sorted(listed) == sorted(r.value for r in OffsetReason)


def test_operations_job_command_lines_are_real(capsys: pytest.CaptureFixture[str]) -> None:
    lines = re.findall(r"^python -m lakebroker\.spark_pipeline\.jobs\.(\w+) +(.*)$", OPERATIONS, flags=re.M)
    modules = {module for module, _ in lines}
    assert {job.value.replace("-", "_") for job in JobName} | {"verify_replica"} == modules
    for module, options in lines:
        with pytest.raises(SystemExit) as done:
            importlib.import_module(f"lakebroker.spark_pipeline.jobs.{module}").main(["--help"])
        assert done.value.code == 0
        usage = capsys.readouterr().out
        for option in re.findall(r"--[a-z-]+", options):
            assert option in usage, (module, option)


def test_operations_says_which_tables_replication_copies() -> None:
    from lakebroker.spark_pipeline.jobs.replication import SNAPSHOT_TABLES

    sentence = OPERATIONS.split("It copies every topic table and the system tables", 1)[1].split(". It does", 1)[0]
    assert set(re.findall(r"`(\w+)`", sentence)) == {*SNAPSHOT_TABLES, "consumer_offsets"}
    assert "tokens" in SNAPSHOT_TABLES  # the failover procedure counts on the clients' tokens coming along
