"""The soak (bench/soak/): its short form end to end, and the Result its counts make.

The short form runs on a cluster of three `serve` nodes sharing a table root (the form that covers
the single node's recovery and failover too): about a minute of mixed produce (single, batch, REST
v2) spread over the nodes, to four topics, while one node (each in turn) and a delivery worker are
SIGKILLed every 20 s, a topic is deleted and re-created, the
scheduler runs key compaction and replication (and compaction, which a 20 s life rarely lets
finish), and the receiver fails 30 % of requests with odd headers. Retention runs once delivery
has drained: its 20 s window is shorter than delivery's lag beside the whole suite (the
10-minute form runs it during the load). Then every
invariant of the soak must hold. Its Spark runs take most of its time: a few minutes in all.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest

import bench.soak.__main__ as soak_cli
from bench.harness.machine import describe
from bench.report import RUN_FILE
from bench.result import Result
from bench.scenarios.soak import MINUTES, SCENARIO
from bench.scenarios.soak_cluster import NODES, SEED
from bench.scenarios.soak_cluster import SCENARIO as CLUSTER
from bench.soak.report import DELIVERY_RSS_MB, SoakReport, passed, to_result

INVARIANTS = ("acknowledged messages lost from Delta", "ids stored more than once in Delta",
              "partitions with offset gaps", "offsets neither delivered nor dead-lettered",
              "subscription partitions stalled at the end of the drain", "verify-replica failures",
              "delivery worker peak RSS")


@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_short_cluster_soak_accounts_for_every_message(tmp_path: Path) -> None:
    assert MINUTES["quick"] == 1.0
    result = CLUSTER.measure("quick", tmp_path / "soak")
    assert result.scenario == "soak_cluster" and result.figures["nodes"] == NODES
    for c in result.checks:
        print(f"{c.name}: {c.shown(c.value)} (target {c.target_text})")
    f = result.figures
    assert f["problems"] == []
    assert [c.name for c in result.checks if not c.met] == []
    assert {c.name for c in result.checks} >= set(INVARIANTS)
    assert passed(result)
    assert f["serve_kills"] >= 2 and f["worker_kills"] >= 2 and f["recreates"] >= 2
    assert f["acked"] > 0 and f["delivered"] > 0
    assert (f["duplicates"], f["gaps"], f["lost"], f["skipped"], f["retention_skips"]) == (0, 0, 0, 0, 0)
    assert f["removed_by_retention"] > 0 or f["rows_removed"].get("retention", 0) > 0
    assert f["job_runs"]["key-compaction"].get("ok", 0) >= 1
    assert f["replica_verified"]
    assert 20 < f["delivery_peak_rss_mb"] <= DELIVERY_RSS_MB


def _clean() -> SoakReport:
    """The counts of a run in which every invariant holds."""
    return SoakReport(minutes=1.0, seconds=300.0, acked=5_000, in_delta=4_000, removed_by_retention=900,
                      compacted_away=100, expected_deliveries=5_000, delivered=4_950, delivered_more_than_once=12,
                      dead_lettered=50, serve_kills=3, worker_kills=2, recreates=3, policy_patches=2,
                      mixed_wal_restarts=2, silent_clients=[5.0] * 40, delivery_peak_rss_mb=420.0,
                      job_starts={"retention": 2}, job_runs={"retention": {"ok": 1}}, rows_removed={"retention": 900},
                      replica_verified=True, replica_output="replica verified\n")


def test_a_run_whose_invariants_hold_meets_every_check() -> None:
    result = to_result(_clean())
    assert result.scenario == SCENARIO.name == "soak"
    assert [c.name for c in result.checks if not c.met] == []
    assert {c.name for c in result.checks} >= set(INVARIANTS)
    assert passed(result) and "every invariant holds" in result.headlines[0]
    rows = {row[0]: row[1] for row in result.tables[0].rows}
    assert rows["messages acknowledged"] == "5,000" and rows["SIGKILLs of serve / of a worker"] == "3 / 2"
    assert rows["silent clients after an early answer closed by the server / slowest"] == "40 of 40 / 5.0 s"
    assert "retention: 2 started, 1 ok (900 rows removed)" in rows[
        "job runs (scheduler; a run cut short by a SIGKILL of serve records no outcome)"]
    assert result.figures["replica_tail"] == ["replica verified"]
    again = Result.from_json(result.to_json())
    assert again.checks == result.checks and again.figures["acked"] == 5_000


@pytest.mark.parametrize(("change", "check"), [
    ({"lost": 1}, "acknowledged messages lost from Delta"),
    ({"duplicates": 2}, "ids stored more than once in Delta"),
    ({"gaps": 1}, "partitions with offset gaps"),
    ({"skipped": 3}, "offsets neither delivered nor dead-lettered"),
    ({"wrong_content": 1}, "deliveries of another message than the table's"),
    ({"retention_skips": 4}, "undelivered messages retention moved a group past"),
    ({"stalled_partitions": 1}, "subscription partitions stalled at the end of the drain"),
    ({"replica_verified": False}, "verify-replica failures"),
    ({"delivery_peak_rss_mb": DELIVERY_RSS_MB + 1.0}, "delivery worker peak RSS"),
    ({"silent_open": 1}, "silent clients not closed by the server within 15 s"),
    ({"mixed_wal_restarts": 0}, "serve restarts whose WAL held batch chunks and singles of one partition"),
    ({"policy_patches": 1}, "cleanup_policy PATCHes of `profiles` under load"),
    ({"jobs_without_success": 1}, "required jobs with no successful run"),
    ({"retention_idle": 1}, "topics with retention it removed nothing from"),
    ({"jobs_wait_timed_out": 1}, "waits for the jobs after the drain that timed out"),
])
def test_each_violation_fails_its_own_check_and_the_soak(change: dict[str, object], check: str) -> None:
    result = to_result(dataclasses.replace(_clean(), **change))  # type: ignore[arg-type]
    assert [c.name for c in result.checks if not c.met] == [check]
    assert not passed(result) and "FAILED (1 checks not met)" in result.headlines[0]
    assert any(check in note for note in result.notes)


def test_a_problem_no_check_counts_still_fails_the_soak() -> None:
    result = to_result(dataclasses.replace(_clean(), problems=["something else went wrong"]))
    assert all(c.met for c in result.checks) and not passed(result)
    assert any("- something else went wrong" in note for note in result.notes)


@pytest.mark.parametrize("ok", [True, False])
def test_make_soak_writes_its_result_renders_the_page_and_exits_by_it(tmp_path: Path, ok: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    report = _clean() if ok else dataclasses.replace(_clean(), lost=1, problems=["orders[0, 7]: lost"])
    calls: list[tuple[float, Path, float, int, int]] = []

    def fake_run(minutes: float, work: Path, *, kill_every_s: float, seed: int, nodes: int) -> SoakReport:
        calls.append((minutes, work, kill_every_s, seed, nodes))
        return report

    monkeypatch.setattr(soak_cli, "run", fake_run)
    monkeypatch.setattr(soak_cli, "every", lambda: [SCENARIO])  # the page of this scenario alone
    results, out = tmp_path / "results", tmp_path / "benchmarks.md"
    results.mkdir()
    (results / RUN_FILE).write_bytes(orjson.dumps({"command": "make bench", "machine": dataclasses.asdict(describe())}))
    with pytest.raises(SystemExit) as exited:
        soak_cli.main(["--minutes", "1", "--kill-every", "20", "--work", str(tmp_path / "work"),
                       "--results-dir", str(results), "--out", str(out)])
    assert exited.value.code == (0 if ok else 1)
    assert calls == [(1.0, tmp_path / "work", 20.0, 12, 1)]
    result = Result.from_json(SCENARIO.result_path(results).read_bytes())
    assert result.command == "python -m bench.soak --minutes 1 --kill-every 20" and result.commit
    assert result.figures["acked"] == 5_000 and passed(result) is ok
    page = out.read_text()
    assert "## Soak" in page and "acknowledged messages lost from Delta" in page
    assert ("**not met**" in page) is not ok
    assert ("- orders[0, 7]: lost" in page) is not ok


def test_make_soak_cluster_writes_its_own_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = dataclasses.replace(_clean(), nodes=NODES)
    seeds: list[int] = []

    def fake_run(minutes: float, work: Path, *, kill_every_s: float, seed: int, nodes: int) -> SoakReport:
        seeds.append(seed)
        return report

    monkeypatch.setattr(soak_cli, "run", fake_run)
    monkeypatch.setattr(soak_cli, "every", lambda: [SCENARIO, CLUSTER])
    results, out = tmp_path / "results", tmp_path / "benchmarks.md"
    results.mkdir()
    (results / RUN_FILE).write_bytes(orjson.dumps({"command": "make bench", "machine": dataclasses.asdict(describe())}))
    with pytest.raises(SystemExit) as exited:
        soak_cli.main(["--nodes", str(NODES), "--results-dir", str(results), "--out", str(out)])
    assert exited.value.code == 0
    assert not SCENARIO.result_path(results).exists()
    result = Result.from_json(CLUSTER.result_path(results).read_bytes())
    assert result.command == "make soak-cluster" and result.scenario == "soak_cluster" and seeds == [SEED]
    rows = {row[0]: row[1] for row in result.tables[0].rows}
    assert rows[f"SIGKILLs of a node (of {NODES}) / of a worker"] == "3 / 2"
    page = out.read_text()
    assert "## Soak on three nodes" in page and "_No result yet: run `make soak` to measure it._" in page
