"""Issue #7: SIGKILL `lakebroker replicate` midway, run it again, and the replica is exact.

Each interrupted run is a real `lakebroker replicate --to DIR` process (in its own process group,
so the kill takes its Spark JVM and Python workers down with it, as a crashed machine would). It is
killed at a moment the test watches for on disk, so the kill lands inside the run:

1. as soon as the first batch is committed to a replica topic table (in practice before the stream
   checkpoint's commit of that batch: the rerun replays the batch, which must be skipped);
2. after a complete run and more produce, as soon as the incremental run plans its first batch
   (checkpoint offset file written, rows not necessarily committed yet).

After each kill the replica must really be partial; after each complete run the replica must hold
exactly the primary's rows: the same row count, offsets and max offset per partition, no (partition,
offset) twice, the same log ends, dead letters and committed offsets; at the end `lakebroker
verify-replica` must pass with no lag.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakebroker.tables import delta
from lakebroker.tables.dead_letters import DeadLetter, DeadLetterTable
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import OffsetReason, OffsetsTable
from tests.spark_pipeline.topics import create_topic, produce, settings_for

pytestmark = [pytest.mark.spark, pytest.mark.fault, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
TOPICS = ("alpha", "bravo")  # copied one after another: kills land in different topics
PARTITIONS = 3
BATCHES = 6  # flusher commits per partition
ROWS = 250  # rows per commit
RUN_TIMEOUT_S = 900.0  # one replicate or verify-replica process (minutes beside the whole suite)
KILL_WINDOW_S = 480.0  # how long to wait for the kill moment (a JVM start beside the whole suite included)


def _lakebroker(data: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "lakebroker", "--data-dir", str(data), *args]


ENV = {**os.environ, "COLUMNS": "200"}


def _run(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_lakebroker(data, *args), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=ENV,
                          cwd=REPO)


def _group_alive(pgid: int) -> list[int]:
    """Processes of the group that are still running (zombies awaiting their reaper do not count)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(stat.parent.name))
    return alive


def _batch_committed(replica: Path) -> Callable[[], bool]:
    """A replica topic table got its first data commit (version 0 is the table's creation)."""

    def moment() -> bool:
        return any(int(f.name[:20]) >= 1 for f in replica.glob("topics/*/_delta_log/*.json"))

    return moment


def _new_batch_planned(replica: Path) -> Callable[[], bool]:
    """A stream wrote an offset-log entry (a planned batch) that was not there when this was called."""
    pattern = "_replication/checkpoints/*/*/offsets/[0-9]*"
    before = set(replica.glob(pattern))

    def moment() -> bool:
        return bool(set(replica.glob(pattern)) - before)

    return moment


def _kill_replicate_when(data: Path, replica: Path, log: Path, moment: Callable[[], bool], what: str) -> None:
    """Start `lakebroker replicate`, SIGKILL its whole process group once `moment()` holds."""
    with log.open("ab") as out:
        proc = subprocess.Popen(_lakebroker(data, "replicate", "--to", str(replica)), stdout=out,
                                stderr=subprocess.STDOUT, env=ENV, cwd=REPO, start_new_session=True)
    pgid = proc.pid
    deadline = time.monotonic() + KILL_WINDOW_S
    try:
        while not moment():
            if proc.poll() is not None:
                pytest.fail(f"replicate exited ({proc.returncode}) before {what}: the kill would not be mid-run\n"
                            + log.read_text()[-3000:])
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {KILL_WINDOW_S}s\n" + log.read_text()[-3000:])
            time.sleep(0.01)
        os.killpg(pgid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(pgid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"replicate was not killed, it exited with {proc.returncode}"
    deadline = time.monotonic() + 30
    while _group_alive(pgid):  # the JVM and Python workers must be gone before the rerun
        assert time.monotonic() < deadline, f"processes {_group_alive(pgid)} survived the SIGKILL"
        time.sleep(0.05)


def _arrow(uri: Path | str, columns: list[str] | None = None) -> pa.Table:
    return DeltaTable(str(uri)).to_pyarrow_table(columns=columns)


def _per_partition(uri: Path | str) -> dict[int, tuple[int, int]]:
    """partition -> (rows, max offset)."""
    stats = _arrow(uri, ["partition", "offset"]).group_by("partition").aggregate(
        [("offset", "count"), ("offset", "max")]).to_pylist()
    return {r["partition"]: (r["offset_count"], r["offset_max"]) for r in stats}


def _duplicates(uri: Path | str) -> list[dict[str, Any]]:
    counts = _arrow(uri, ["partition", "offset"]).group_by(["partition", "offset"]).aggregate([("offset", "count")])
    return [r for r in counts.to_pylist() if r["offset_count"] > 1]


def _offsets(uri: Path | str) -> set[tuple[int, int]]:
    return {(r["partition"], r["offset"]) for r in _arrow(uri, ["partition", "offset"]).to_pylist()}


def _rows(uri: Path) -> int:
    return _arrow(uri, ["offset"]).num_rows if (uri / "_delta_log").is_dir() else 0


def _latest_positions(uri: Path | str) -> dict[tuple[str, str, int], int]:
    latest: dict[tuple[str, str, int], tuple[Any, int]] = {}
    for r in _arrow(uri).to_pylist():
        key = (r["group"], r["topic"], r["partition"])
        if key not in latest or r["committed_at"] > latest[key][0]:
            latest[key] = (r["committed_at"], r["offset"])
    return {k: v[1] for k, v in latest.items()}


def _produce_round(data: Path, rows: int) -> None:
    settings = settings_for(data)
    for topic in TOPICS:
        for p in range(PARTITIONS):
            produce(settings, topic, p, rows)


def _assert_partial(layout: Layout, replica: Path) -> None:
    """The killed run left the replica behind the primary (it really was interrupted)."""
    primary = sum(_rows(Path(layout.topic_table(t))) for t in TOPICS)
    copied = sum(_rows(replica / "topics" / t) for t in TOPICS)
    assert 0 < copied < primary, f"the kill did not land mid-run: {copied} of {primary} rows replicated"


def _assert_exact_replica(layout: Layout, replica: Path) -> None:
    for topic in TOPICS:
        source, target = layout.topic_table(topic), replica / "topics" / topic
        assert _duplicates(target) == [], f"{topic}: (partition, offset) rows copied twice"
        primary = _per_partition(source)
        assert len(primary) == PARTITIONS
        assert _per_partition(target) == primary, f"{topic}: rows / max offset per partition differ"
        assert _offsets(target) == _offsets(source), f"{topic}: the replica's offsets differ"
        # The replica carries each partition's log end, so it could be promoted.
        ends = [[DeltaTable(str(t)).transaction_version(delta.partition_app_id(p)) for p in range(PARTITIONS)]
                for t in (source, target)]
        assert ends[1] == ends[0] == [primary[p][1] + 1 for p in range(PARTITIONS)]
    letters = [_arrow(t, ["group", "topic", "partition", "offset"]).to_pylist()
               for t in (layout.dead_letters_table, replica / "_system" / "dead_letters")]
    assert sorted(letters[1], key=str) == sorted(letters[0], key=str)
    assert _latest_positions(replica / "_system" / "consumer_offsets") == _latest_positions(layout.offsets_table)


def _verify_ok(data: Path, replica: Path) -> None:
    result = _run(data, "verify-replica", "--to", str(replica), "--max-lag-messages", "0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "replica OK: lag 0 messages" in result.stdout


@pytest.mark.timeout(1200)  # a long chain of Spark jobs: minutes when the suite runs in parallel
def test_replicate_killed_midway_then_rerun_is_exact(tmp_path: Path) -> None:
    data, replica, log = tmp_path / "data", tmp_path / "replica", tmp_path / "replicate.log"
    settings = settings_for(data)
    layout = Layout(data)
    for topic in TOPICS:
        create_topic(settings, topic, partitions=PARTITIONS)
    for _ in range(BATCHES):
        _produce_round(data, ROWS)
    offsets = OffsetsTable(layout)
    offsets.commit("billing", "alpha", {0: 100, 1: 50}, OffsetReason.ACK)
    offsets.commit("billing", "alpha", {0: 400}, OffsetReason.ACK)
    DeadLetterTable(layout).add([DeadLetter.from_exhausted_retries("billing", "alpha", 2, 7, 5, 500, "boom")])

    # 1. Killed right after the first batch lands in a replica table.
    _kill_replicate_when(data, replica, log, _batch_committed(replica), "batch committed to a replica table")
    _assert_partial(layout, replica)
    assert not (replica / "_system" / "dead_letters").exists(), "the killed run got to the system tables"

    # A run to completion: the replica is exact.
    done = _run(data, "replicate", "--to", str(replica))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _assert_exact_replica(layout, replica)

    # 2. More produce and offset commits; the incremental run is killed midway too, then resumes.
    for _ in range(2):
        _produce_round(data, ROWS)
    offsets.commit("billing", "bravo", {1: 30}, OffsetReason.ACK)
    _kill_replicate_when(data, replica, log, _new_batch_planned(replica), "incremental batch planned")
    _assert_partial(layout, replica)
    done = _run(data, "replicate", "--to", str(replica))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _verify_ok(data, replica)
    _assert_exact_replica(layout, replica)
    assert sum(_rows(replica / "topics" / t) for t in TOPICS) == len(TOPICS) * PARTITIONS * (BATCHES + 2) * ROWS
