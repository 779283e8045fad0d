from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tables import delta
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


def test_a_read_sees_another_writers_commit_and_an_unchanged_table_is_not_reloaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "state")
    reader, writer = StateTable(uri, SCHEMA, 1), StateTable(uri, SCHEMA, 1)
    writer.mutate(lambda rows: ([{"name": "a", "n": 1}], None))
    assert reader.read() == [{"name": "a", "n": 1}]

    catch_ups: list[str] = []
    original = DeltaTable.update_incremental

    def counted(self: DeltaTable) -> None:
        catch_ups.append(self.table_uri)
        original(self)

    monkeypatch.setattr(DeltaTable, "update_incremental", counted)
    monkeypatch.setattr(delta, "load", lambda *a, **k: pytest.fail("an unchanged table was loaded again"))
    assert reader.read() == [{"name": "a", "n": 1}]
    assert catch_ups == []  # no new commit file: the snapshot and its rows are reused

    monkeypatch.undo()
    writer.mutate(lambda rows: ([{"name": "a", "n": 2}], None))  # another process's commit
    monkeypatch.setattr(DeltaTable, "update_incremental", counted)
    assert reader.read() == [{"name": "a", "n": 2}]
    assert len(catch_ups) == 1
    assert reader.mutate(lambda rows: ([{"name": "a", "n": rows[0]["n"] + 1}], "ok")) == "ok"
    assert writer.read() == [{"name": "a", "n": 3}]
