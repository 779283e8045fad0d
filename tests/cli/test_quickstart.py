"""The README quickstart, run for real: CLI produce, Spark SQL query, table history."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.markdown_blocks import code_blocks

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def lakebroker(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(data), *args],
                          capture_output=True, text=True, timeout=300)


README = Path(__file__).resolve().parents[2] / "README.md"
GUIDE = README.parent / "docs" / "getting-started.md"


def quickstart_commands() -> list[list[str]]:
    """The `lakebroker ...` lines of the README's quickstart block, as argument lists; docs/getting-started.md
    shows the same block, marked as run here."""
    block = README.read_text().split("<!-- quickstart -->", 1)[1].split("<!-- /quickstart -->", 1)[0]
    shown = [b.text for b in code_blocks(GUIDE) if b.tested_by == "tests/cli/test_quickstart.py"]
    assert shown == [block.split("```bash\n", 1)[1].split("```", 1)[0]], GUIDE
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("lakebroker ")]


def test_readme_quickstart_step_by_step(tmp_path: Path) -> None:
    data = tmp_path / "data"
    commands = quickstart_commands()
    assert [c[0] for c in commands] == ["topics", "produce", "sql", "sql", "sql"]
    outputs = []
    for args in commands:
        result = lakebroker(data, *args)
        assert result.returncode == 0, (args, result.stderr[-800:])
        outputs.append(result.stdout)
    assert outputs[1].strip() == "partition 2 offset 0"  # murmur2("k1") % 3, as Kafka would choose
    count_rows = [line for line in outputs[2].splitlines() if "│" in line]
    assert count_rows[-1].split("│")[1].strip() == "1"
    message = [c.strip() for c in [line for line in outputs[3].splitlines() if "│" in line][-1].split("│")[1:-1]]
    assert message == ["2", "0", "k1", "hello"]
    history = outputs[4]
    assert history.count("WRITE") == 1 and "CREATE TABLE" in history
    # (Time travel by version and timestamp is tested in process: tests/spark_pipeline.)


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
