"""A WAL skip's commit to the topic table (tables/lost_offsets.py `skip_in_table`) is fenced as an
owner's flush is (tables/fencing.py), against real delta-rs tables: a deposed owner's skip is
refused and leaves the table as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakebroker.ingest_api.flush_rows import records_to_arrow
from lakebroker.ingest_api.records import Record
from lakebroker.tables import delta, fencing
from lakebroker.tables.lost_offsets import skip_in_table
from lakebroker.tables.topics import Holes, ensure_topic_table


def _commit(table: DeltaTable, node: str, partition: int, epoch: int, start: int, n: int) -> None:
    """What an owner's flush commits: n rows from `start`, with the fencing txns."""
    rows = records_to_arrow([Record("t", b"\0" * 16, partition, start + i, 1, None, b"v", "text", None, None, None,
                                    None) for i in range(n)])
    delta.append(table, rows, txns=fencing.commit_txns(node, {partition: epoch}, {partition: start + n}))


def _state(uri: str, partition: int = 0) -> tuple[int, int, Holes]:
    """The partition's committed end, its owner epoch, and the table's recorded holes."""
    table = DeltaTable(uri)
    return (delta.committed_end(table, partition), fencing.stored_epoch(table, partition),
            Holes.of(table.metadata().configuration))


@pytest.fixture
def tables(tmp_path: Path) -> tuple[str, DeltaTable]:
    """Partition 0 written by node a at epoch 1 (offsets 0-4), then claimed by b at epoch 2, which
    committed offsets 5-7; and a's handle, as its own commit left it."""
    uri = str(tmp_path / "topic")
    ensure_topic_table(uri)
    a = DeltaTable(uri)
    fencing.claim(a, {0: 1}, node="a")
    _commit(a, "a", 0, 1, 0, 5)
    b = DeltaTable(uri)
    assert fencing.claim(b, {0: 2}, node="b") == {0: 5}
    _commit(b, "b", 0, 2, 5, 3)
    return uri, a


@pytest.fixture
def uri(tables: tuple[str, DeltaTable]) -> str:
    return tables[0]


def test_a_deposed_owners_skip_is_refused_and_the_owners_works(uri: str) -> None:
    version = DeltaTable(uri).version()
    with pytest.raises(fencing.Deposed) as refused:
        skip_in_table(DeltaTable(uri), "t", 0, 8, 9, {}, node="a", epoch=1)
    assert refused.value.newer == {0: 2}
    assert DeltaTable(uri).version() == version, "nothing committed"
    assert _state(uri) == (8, 2, Holes())

    assert skip_in_table(DeltaTable(uri), "t", 0, 8, 9, {}, node="b", epoch=2) == 10
    assert _state(uri) == (10, 2, Holes(lost={0: ((8, 9),)}))
    assert fencing.node_end(DeltaTable(uri), "b", 0) == 10
    assert skip_in_table(DeltaTable(uri), "t", 0, 8, 9, {}, node="b", epoch=2) == 10, "done already"
    assert DeltaTable(uri).version() == version + 1


def test_a_skip_planned_before_the_claim_is_refused(tables: tuple[str, DeltaTable]) -> None:
    """a's snapshot predates b's claim: its skip conflicts in the table, and a fresh look finds the
    newer epoch."""
    uri, stale = tables
    assert (delta.committed_end(stale, 0), fencing.stored_epoch(stale, 0)) == (5, 1)
    with pytest.raises(fencing.Deposed):
        skip_in_table(stale, "t", 0, 5, 6, {}, node="a", epoch=1)
    assert _state(uri) == (8, 2, Holes())


def test_another_partitions_commit_since_the_snapshot_does_not_stop_a_skip(uri: str) -> None:
    table = DeltaTable(uri)
    other = DeltaTable(uri)
    fencing.claim(other, {1: 1}, node="c")
    _commit(other, "c", 1, 1, 0, 2)
    assert skip_in_table(table, "t", 0, 8, 9, {}, node="b", epoch=2) == 10
    assert _state(uri) == (10, 2, Holes(lost={0: ((8, 9),)}))
    assert delta.committed_end(DeltaTable(uri), 1) == 2
