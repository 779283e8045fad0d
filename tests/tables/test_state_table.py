from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakebroker.tables import delta
from lakebroker.tables.state_table import RECHECK_AFTER_S, Rows, StateTable

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


QUICK_CLEANUP = {"delta.logRetentionDuration": "interval 1 second",
                 "delta.deletedFileRetentionDuration": "interval 1 second", "delta.checkpointInterval": "10"}


def _files(uri: str) -> tuple[int, int]:
    """(commit files in the log, data files in the table directory)"""
    root = Path(uri)
    return len(list((root / "_delta_log").glob("*.json"))), len(list(root.glob("*.parquet")))


def test_state_tables_get_a_short_log_and_file_retention(tmp_path: Path) -> None:
    table = StateTable(str(tmp_path / "state"), SCHEMA, 1)
    table.mutate(lambda rows: ([{"name": "a", "n": 1}], None))
    configuration = DeltaTable(table.uri).metadata().configuration
    assert configuration["delta.logRetentionDuration"] == "interval 1 hour"
    assert configuration["delta.deletedFileRetentionDuration"] == "interval 1 hour"

    # A table created before the properties existed gets them at its next open.
    old = str(tmp_path / "old")
    delta.ensure_table(old, SCHEMA, partition_by=None, version=1)
    assert "delta.logRetentionDuration" not in DeltaTable(old).metadata().configuration
    StateTable(old, SCHEMA, 1).mutate(lambda rows: ([{"name": "a", "n": 1}], None))
    assert DeltaTable(old).metadata().configuration["delta.logRetentionDuration"] == "interval 1 hour"


def test_a_table_rewritten_at_every_heartbeat_keeps_a_bounded_log_and_directory(tmp_path: Path) -> None:
    table = StateTable(str(tmp_path / "leases"), SCHEMA, 1, properties=QUICK_CLEANUP)
    for n in range(91):
        table.mutate(lambda rows, n=n: ([{"name": "beat", "n": n}], None))
        if n in (30, 60):
            time.sleep(1.2)  # every file so far is past the retention
    commits, data_files = _files(table.uri)
    # 92 versions and 91 data files written. The checkpoints drop commits past the retention
    # (delta-rs keeps back to the checkpoint before), and the vacuum after each deletes the
    # replaced files past it, so what is left is about the last phase's 30 of each.
    assert commits <= 45 and data_files <= 35, (commits, data_files)
    assert table.read() == [{"name": "beat", "n": 90}]
    assert DeltaTable(table.uri).to_pyarrow_table().to_pylist() == [{"name": "beat", "n": 90}]


def test_a_snapshot_older_than_the_log_cleanup_is_reloaded_not_trusted(tmp_path: Path) -> None:
    uri = str(tmp_path / "leases")
    now = [0.0]
    writer = StateTable(uri, SCHEMA, 1, properties=QUICK_CLEANUP)
    reader = StateTable(uri, SCHEMA, 1, properties=QUICK_CLEANUP, clock=lambda: now[0])
    writer.mutate(lambda rows: ([{"name": "a", "n": 0}], None))
    assert reader.read() == [{"name": "a", "n": 0}]
    seen = DeltaTable(uri).version()
    for n in range(1, 15):
        writer.mutate(lambda rows, n=n: ([{"name": "a", "n": n}], None))
    time.sleep(1.2)
    for n in range(15, 25):
        writer.mutate(lambda rows, n=n: ([{"name": "a", "n": n}], None))
    # The cleanup took the commit after the reader's snapshot, so "no next commit file" would
    # wrongly mean "unchanged"; a snapshot that old is reloaded instead.
    assert not delta.has_commit(uri, seen + 1)
    now[0] += RECHECK_AFTER_S + 1
    assert reader.read() == [{"name": "a", "n": 24}]


def test_a_kept_table_catches_up_and_is_reloaded_every_reload_after_versions(tmp_path: Path) -> None:
    """delta-rs re-scans one batch per commit an open handle applied since its load: a kept handle
    is replaced by a fresh load every RELOAD_AFTER_VERSIONS, and caught up in between."""
    uri = str(tmp_path / "t")
    schema = pa.schema([pa.field("n", pa.int64())])
    kept = delta.KeptTable(uri, lambda: delta.ensure_table(uri, schema, partition_by=None, version=1))
    first = kept.current()
    loaded = first.version()
    delta.append(delta.load(uri), pa.table({"n": [0]}, schema=schema))  # another writer
    assert kept.current() is first and first.version() == loaded + 1  # caught up, same handle
    while first.version() < loaded + delta.RELOAD_AFTER_VERSIONS - 1:
        delta.append(kept.current(), pa.table({"n": [first.version()]}, schema=schema))
    assert kept.current() is first  # RELOAD_AFTER_VERSIONS - 1 past its load: kept
    delta.append(first, pa.table({"n": [-1]}, schema=schema))
    reloaded = kept.current()
    assert reloaded is not first and reloaded.version() == loaded + delta.RELOAD_AFTER_VERSIONS
    assert kept.current() is reloaded
    assert reloaded.to_pyarrow_table().num_rows == delta.RELOAD_AFTER_VERSIONS


def test_a_state_tables_handle_is_reloaded_after_reload_after_versions_of_its_own_writes(tmp_path: Path) -> None:
    table = StateTable(str(tmp_path / "s"), SCHEMA, 1)
    table.mutate(lambda rows: ([{"name": "a", "n": 0}], None))
    first = table._snapshot.table
    assert first is not None
    start = first.version()
    for i in range(1, delta.RELOAD_AFTER_VERSIONS + 1):
        table.mutate(lambda rows, i=i: ([{"name": "a", "n": i}], None))
    assert first.version() >= start + delta.RELOAD_AFTER_VERSIONS - 1
    assert table._snapshot.table is not first  # a fresh load, not the handle that applied 50 commits
    assert table.read() == [{"name": "a", "n": delta.RELOAD_AFTER_VERSIONS}]


def test_expired_logs_are_cleaned_with_the_commits_that_checkpoint_and_only_then(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """delta-rs's cleanup lists the whole log: commit_hooks asks for it on checkpoint commits only,
    where checkpoints are frequent only on one per CLEANUP_EVERY_VERSIONS (here 10, for 5: every
    other checkpoint), and the log is still cleaned there."""
    monkeypatch.setattr(delta, "CLEANUP_EVERY_VERSIONS", 8)  # rounded up to a multiple of the interval: 10
    uri = str(tmp_path / "t")
    schema = pa.schema([pa.field("n", pa.int64())])
    table = delta.ensure_table(uri, schema, partition_by=None, version=1, properties={
        "delta.checkpointInterval": "5", "delta.logRetentionDuration": "interval 0 seconds"})
    asked = {}
    while table.version() < 12:
        asked[table.version() + 1] = delta.commit_hooks(table).cleanup_expired_logs
        delta.append(table, pa.table({"n": [table.version()]}, schema=schema))
    assert {v for v, cleanup in asked.items() if cleanup} == {9}  # not 4, though it wrote a checkpoint
    log = tmp_path / "t" / "_delta_log"
    assert sorted(int(p.name[:20]) for p in log.glob("*.checkpoint.parquet")) == [9]  # 4 was cleaned at 9
    assert sorted(int(p.name[:20]) for p in log.glob("*.json")) == [9, 10, 11, 12]  # cleaned at checkpoint 9
    assert delta.load(uri).to_pyarrow_table().num_rows == len(asked)
    table.alter.set_table_properties({"delta.enableExpiredLogCleanup": "false"})
    while (table.version() + 2) % 5:
        delta.append(table, pa.table({"n": [0]}, schema=schema))
    assert delta.commit_hooks(table).cleanup_expired_logs is False  # a table that opted out stays out
