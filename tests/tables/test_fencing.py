"""Fencing in the topic table (tables/fencing.py), against real delta-rs tables: each step of the
argument in the module's docstring, proved on its own."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from lakebroker.ingest_api.flush_rows import records_to_arrow
from lakebroker.ingest_api.records import Record
from lakebroker.tables import delta, fencing
from lakebroker.tables.topics import ensure_topic_table


def _rows(partition: int, start: int, n: int) -> pa.Table:
    return records_to_arrow([Record("t", b"\0" * 16, partition, start + i, 1, None, b"v", "text", None, None, None,
                                    None) for i in range(n)])


def _commit(table: DeltaTable, node: str, epochs: dict[int, int], start: dict[int, int], n: int) -> None:
    """What an owner's flush commits: n rows per partition from `start`, with the fencing txns."""
    data = pa.concat_tables([_rows(p, start[p], n) for p in epochs])
    delta.append(table, data, txns=fencing.commit_txns(node, epochs, {p: start[p] + n for p in epochs}))


def _offsets(uri: str, partition: int) -> list[int]:
    rows = DeltaTable(uri).to_pyarrow_table(filters=[("partition", "=", partition)], columns=["offset"])
    return sorted(rows.column("offset").to_pylist())


@pytest.fixture
def uri(tmp_path: Path) -> str:
    uri = str(tmp_path / "topic")
    ensure_topic_table(uri)
    return uri


def test_a_claim_makes_the_deposed_owners_next_commit_fail_in_the_table(uri: str) -> None:
    old = DeltaTable(uri)
    assert fencing.claim(old, {0: 1}, node="a") == {0: 0}
    _commit(old, "a", {0: 1}, {0: 0}, 5)  # on the snapshot its own claim left

    new = DeltaTable(uri)
    assert fencing.claim(new, {0: 2}, node="b") == {0: 5}  # goes on from the end it read
    version = DeltaTable(uri).version()
    with pytest.raises(CommitFailedError, match="Concurrent transaction"):
        _commit(old, "a", {0: 1}, {0: 5}, 3)  # planned on the snapshot before the claim
    assert DeltaTable(uri).version() == version, "the refused commit left nothing behind"
    assert _offsets(uri, 0) == list(range(5))

    # Reloaded, the old owner sees the newer epoch before it could commit again, and cannot claim back.
    reloaded = DeltaTable(uri)
    assert fencing.deposed(reloaded, {0: 1}) == {0}
    with pytest.raises(fencing.Deposed) as refused:
        fencing.claim(reloaded, {0: 1}, node="a")
    assert refused.value.partitions == {0}

    _commit(new, "b", {0: 2}, {0: 5}, 4)  # the new owner: dense, from the claimed end
    table = DeltaTable(uri)
    assert _offsets(uri, 0) == list(range(9))
    assert (fencing.stored_epoch(table, 0), delta.committed_end(table, 0)) == (2, 9)
    assert (fencing.node_end(table, "a", 0), fencing.node_end(table, "b", 0), fencing.node_end(table, "c", 0)) == (
        5, 9, None)


def test_owners_of_other_partitions_are_not_fenced(uri: str) -> None:
    a, b = DeltaTable(uri), DeltaTable(uri)
    fencing.claim(a, {0: 1}, node="a")
    b.update_incremental()
    fencing.claim(b, {1: 1}, node="b")  # a's snapshot predates this: it writes other app ids
    _commit(a, "a", {0: 1}, {0: 0}, 3)
    _commit(b, "b", {1: 1}, {1: 0}, 2)
    _commit(a, "a", {0: 1}, {0: 3}, 3)
    assert (_offsets(uri, 0), _offsets(uri, 1)) == (list(range(6)), list(range(2)))


def test_a_claim_on_a_stale_snapshot_fails_and_a_fresh_one_continues_after_the_late_commit(uri: str) -> None:
    old = DeltaTable(uri)
    fencing.claim(old, {0: 1}, node="a")
    stale = DeltaTable(uri)
    _commit(old, "a", {0: 1}, {0: 0}, 4)  # lands after the claimant's snapshot
    with pytest.raises(CommitFailedError):
        fencing.claim(stale, {0: 2}, node="b")
    assert fencing.claim(DeltaTable(uri), {0: 2}, node="b") == {0: 4}
    # A claim is not a commit of the claimant's: none of its WAL is in the table yet.
    assert fencing.node_end(DeltaTable(uri), "b", 0) is None
    _commit(DeltaTable(uri), "b", {0: 2}, {0: 4}, 2)
    fencing.claim(DeltaTable(uri), {0: 3}, node="a")  # a's own end stays its last commit's, 4
    assert (fencing.node_end(DeltaTable(uri), "a", 0), fencing.node_end(DeltaTable(uri), "b", 0)) == (4, 6)


def test_a_claim_lands_past_commits_to_other_partitions_made_since_its_snapshot(uri: str) -> None:
    """Other partitions' owners commit every flush interval: a claim whose load takes longer (an
    object store under load) must not lose to each of them and load again (claims took 10-30 s)."""
    fencing.claim(DeltaTable(uri), {1: 1}, node="a")
    _commit(DeltaTable(uri), "a", {1: 1}, {1: 0}, 2)
    snapshot = DeltaTable(uri)
    for start in (2, 5):  # a's flushes of partition 1, after the claimant's snapshot
        _commit(DeltaTable(uri), "a", {1: 1}, {1: start}, 3)
    assert fencing.claim(snapshot, {0: 1}, node="b") == {0: 0}
    table = DeltaTable(uri)
    assert (fencing.stored_epoch(table, 0), fencing.stored_epoch(table, 1)) == (1, 1)
    assert _offsets(uri, 1) == list(range(8))


def test_a_writer_that_catches_up_must_read_the_epoch_again(uri: str) -> None:
    """delta-rs checks no order: on a snapshot that includes the claim, the old owner's commit
    would land. `deposed` is the check such a writer makes first."""
    old = DeltaTable(uri)
    fencing.claim(old, {0: 1}, node="a")
    fencing.claim(DeltaTable(uri), {0: 2}, node="b")
    old.update_incremental()
    assert fencing.deposed(old, {0: 1}) == {0}
    _commit(old, "a", {0: 1}, {0: 0}, 1)  # what a writer that skipped the check would do
    assert fencing.stored_epoch(DeltaTable(uri), 0) == 1, "it lands: the check is the writer's to make"
