"""The README quickstart, run for real: CLI produce, Spark SQL query, table history."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark


def lakebroker(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(data), *args],
                          capture_output=True, text=True, timeout=300)


def test_quickstart_produce_query_and_history(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert lakebroker(data, "topics", "create", "orders", "--partitions", "3").returncode == 0
    produced = lakebroker(data, "produce", "orders", "hello", "--key", "k1")
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout.strip() == "partition 2 offset 0"  # murmur2("k1") % 3, as Kafka would choose
    lakebroker(data, "produce", "orders", '{"total": 42}', "--json", "--key", "k2")
    listed = lakebroker(data, "topics", "list")
    assert "orders" in listed.stdout and "3" in listed.stdout

    query = ("SELECT count(*) AS n, min(CAST(value AS STRING)) AS v FROM orders;")
    result = lakebroker(data, "sql", query.rstrip(";"))
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if "│" in line]
    assert rows[-1].split("│")[1].strip() == "2"
    assert rows[-1].split("│")[2].strip() == "hello"

    history = lakebroker(data, "sql", "DESCRIBE HISTORY orders")
    assert history.returncode == 0, history.stderr
    assert history.stdout.count("WRITE") == 2  # one Delta commit per flushed produce
    assert "CREATE TABLE" in history.stdout

    # Time travel: the version before the last produce holds one row.
    header = next(line for line in history.stdout.splitlines() if "┃" in line)
    assert header.split("┃")[1].strip() == "version"
    latest = max(int(line.split("│")[1]) for line in history.stdout.splitlines() if "│" in line)
    travel = lakebroker(data, "sql", f"SELECT count(*) FROM orders VERSION AS OF {latest - 1}")
    assert [line for line in travel.stdout.splitlines() if "│" in line][-1].split("│")[1].strip() == "1"


def test_cli_bad_input_gives_one_line_and_nonzero_exit(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lakebroker(data, "topics", "create", "orders", "--partitions", "1")
    cases = [
        (("produce", "nope", "x"), "topic 'nope' does not exist"),
        (("produce", "../etc", "x"), "invalid topic name"),
        (("topics", "create", "orders"), "already exists"),
        (("topics", "create", "bad name"), "invalid topic name"),
        (("produce", "orders", "x", "--partition", "5"), "out of range"),
        (("produce", "orders", "{", "--json"), "not JSON"),
        (("sql", "SELEC nonsense"), "PARSE_SYNTAX_ERROR"),
        (("sql", "SELECT * FROM missing_table"), "TABLE_OR_VIEW_NOT_FOUND"),
    ]
    for args, needle in cases:
        result = lakebroker(data, *args)
        assert result.returncode != 0, args
        assert "Traceback" not in result.stderr, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and needle in errors[0], (args, result.stderr[-500:])
    usage = lakebroker(data, "topics", "create", "x", "--partitions", "zero")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
