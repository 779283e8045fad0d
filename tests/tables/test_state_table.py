from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa

from tables.state_table import Rows, StateTable

SCHEMA = pa.schema([pa.field("name", pa.string()), pa.field("n", pa.int64())])


def test_concurrent_mutations_are_never_lost(tmp_path: Path) -> None:
    table = StateTable(str(tmp_path / "state"), SCHEMA, 1)

    def bump(rows: Rows) -> tuple[Rows, None]:
        current = rows[0]["n"] if rows else 0
        return [{"name": "counter", "n": current + 1}], None

    def worker() -> None:
        for _ in range(15):
            table.mutate(bump)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert table.read() == [{"name": "counter", "n": 45}]


def test_unchanged_rows_make_no_commit(tmp_path: Path) -> None:
    table = StateTable(str(tmp_path / "state"), SCHEMA, 1)
    table.mutate(lambda rows: ([{"name": "a", "n": 1}], None))
    from deltalake import DeltaTable

    before = DeltaTable(table.uri).version()
    assert table.mutate(lambda rows: (rows, "same")) == "same"
    assert DeltaTable(table.uri).version() == before
