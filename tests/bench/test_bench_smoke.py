"""The benchmark harness in its tiny mode: each ingest scenario runs end to end and returns its data, the
runner keeps a failed scenario's last good result, and the page renders from the JSON results.

No timing is asserted: the figures of a few-second run on a shared machine mean nothing. What is checked
is that every scenario produced positive numbers and its checks, the results round-trip through JSON, the
page holds every scenario's declaration and figures, and docs/benchmarks.md and bench/results are left alone
(everything goes to tmp_path).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import orjson
import pytest
import uvicorn

from bench.harness import baseline_app, plots
from bench.harness.sampler import Sampler
from bench.report import render
from bench.result import REPO, RESULTS_DIR, Check, Result, Scenario
from bench.run import measure_in_process, run
from bench.scenarios import ORDER, every, scenario

pytestmark = pytest.mark.timeout(300)

REAL_REPORT = REPO / "docs" / "benchmarks.md"
INGEST = ("single_produce", "batch_produce", "flush", "produce_to_table", "profile")


def _snapshot(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def _results_snapshot() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in RESULTS_DIR.glob("*.json")} if RESULTS_DIR.exists() else {}


def test_every_scenario_declares_what_it_measures() -> None:
    assert [s.name for s in every()] == list(ORDER)
    for s in every():
        assert s.title
        for part in (s.setup, s.load, s.metric, s.target):
            assert len(part) > 20, (s.name, part)
        assert callable(s.measure)


def test_tiny_ingest_scenarios_return_positive_figures_and_the_page_renders(tmp_path: Path) -> None:
    before, kept = _snapshot(REAL_REPORT), _results_snapshot()
    results = {name: measure_in_process(scenario(name), "tiny") for name in INGEST}

    single = results["single_produce"].figures
    assert single["points"] and all(p["baseline_rps"] > 0 and p["broker_ok_rps"] > 0 and p["broker_cpu_s"] > 0
                                    for p in single["points"].values())
    assert all(v > 0 for v in single["decomposition"].values())
    batch = results["batch_produce"].figures
    assert batch["rows"] and all(r["msg_s"] > 0 and r["errors"] == 0 for r in batch["rows"])
    assert batch["server"]["rows"] > 0 and batch["server"]["commits"] > 0
    assert all(r["flush_rows_s"] > 0 and r["floor_rows_s"] > 0 for r in results["flush"].figures["rows"])
    for v in results["produce_to_table"].figures["runs"]:
        assert v["acked"] > 0 and v["not_visible"] == 0 and v["visible_s"] and min(v["visible_s"]) > 0
    assert all(p["samples"] > 0 and p["main_seconds"] > 0 for p in results["profile"].figures["profiles"])
    # serve's peak RSS in each server: a real reading (a Python process is tens of MB)
    peaks = [c.value for r in results.values() for c in r.checks if c.unit == "MB"]
    assert len(peaks) == 3 and all(20 < mb < 24_000 for mb in peaks), peaks
    for name in ("single_produce", "batch_produce", "flush", "produce_to_table"):
        assert results[name].checks, name
        assert results[name].tables and all(t.rows for t in results[name].tables), name

    out = tmp_path / "results"
    out.mkdir()
    for name, result in results.items():
        again = Result.from_json(result.to_json())
        assert again == result, name
        (out / f"{name}.json").write_bytes(result.to_json())
    page = render(every(), out, failed={"big_bodies": "exit 1: boom"})
    for s in every():
        assert f"## {s.title}" in page and s.setup in page
    for result in results.values():
        for check in result.checks:
            assert check.name in page and check.shown(check.value) in page
    assert "_No result yet: this run's attempt failed (exit 1: boom); run `make bench` to measure it._" in page
    assert "run `make soak` to measure it." in page
    assert results["batch_produce"].tables[0].rows[0][0] in page
    assert _snapshot(REAL_REPORT) == before and _results_snapshot() == kept

    points = single["points"]
    png = tmp_path / "throughput.png"
    plots.throughput([int(c) for c in points], [p["baseline_rps"] for p in points.values()],
                     [p["broker_ok_rps"] for p in points.values()], 0.5, png)
    cdf = tmp_path / "cdf.png"
    plots.visibility_cdf([(v["label"], v["visible_s"]) for v in results["produce_to_table"].figures["runs"]], 1.0,
                         cdf)
    assert png.stat().st_size > 1000 and cdf.stat().st_size > 1000


def _passes(mode: str, work: Path) -> Result:
    return Result("fake", checks=[Check("answers", 3.0, "x", 2.0)], notes=[f"mode={mode}"])


def _fails(mode: str, work: Path) -> Result:
    raise RuntimeError("no spark here")


def _hangs(mode: str, work: Path) -> Result:
    time.sleep(600)
    raise AssertionError("unreachable")


PASSES = Scenario("fake_passes", "Passes", "set-up text", "load text", "metric text", "target text", _passes)
FAILS = Scenario("fake_fails", "Fails", "set-up text", "load text", "metric text", "target text", _fails)
HANGS = Scenario("fake_hangs", "Hangs", "set-up text", "load text", "metric text", "target text", _hangs,
                 timeout_s=3)


def test_a_failed_scenario_keeps_its_last_result_and_the_page_says_so(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    results, page = tmp_path / "results", tmp_path / "benchmarks.md"
    results.mkdir()
    old = Result("fake_fails", notes=["the-last-good-figures"]).stamp("full", 1.0)
    (results / "fake_fails.json").write_bytes(old.to_json())
    module = "tests.bench.test_bench_smoke"
    declared = {f"{module}:{attr}": getattr(__import__(module, fromlist=[attr]), attr)
                for attr in ("PASSES", "FAILS", "HANGS")}
    monkeypatch.setattr("bench.run.every", lambda: list(declared.values()))
    monkeypatch.setattr("bench.run.scenario", lambda name: declared[name])

    failed = run("full", list(declared), page, results, "pytest")

    assert set(failed) == {"fake_fails", "fake_hangs"}
    assert "RuntimeError: no spark here" in failed["fake_fails"]
    assert failed["fake_hangs"] == "did not finish within 3 s"
    fresh = Result.from_json((results / "fake_passes.json").read_bytes())
    assert fresh.notes == ["mode=full"] and fresh.checks[0].met and fresh.commit
    assert Result.from_json((results / "fake_fails.json").read_bytes()) == old  # kept, not overwritten
    assert not (results / "fake_hangs.json").exists()
    text = page.read_text()
    assert "the-last-good-figures" in text and "these figures are its last good run's" in text
    assert "| [Passes](#passes) | answers | 3.00x | ≥ 2.00x |  | **met** |" in text
    assert "_No result yet: this run's attempt failed (did not finish within 3 s)" in text
    assert orjson.loads((results / "_run.json").read_bytes())["command"] == "pytest"


def test_the_baseline_runs_under_the_servers_uvicorn_settings(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from lakebroker.server import run_server
    from lakebroker.tables.settings import Settings

    captured: dict[str, uvicorn.Config] = {}

    class Captured:
        def __init__(self, config: uvicorn.Config) -> None:
            captured["config"] = config

        def run(self, sockets: object = None) -> None:
            return None

    monkeypatch.setattr(uvicorn, "Server", Captured)
    run_server(Settings(data_dir=tmp_path / "data", port=0))
    served = captured["config"]
    ours = uvicorn.Config(baseline_app.app, **baseline_app.uvicorn_settings())
    for name in ("loop", "lifespan", "limit_concurrency", "h11_max_incomplete_event_size", "backlog",
                 "timeout_keep_alive", "timeout_graceful_shutdown", "server_header", "access_log", "ws"):
        assert getattr(ours, name) == getattr(served, name), name
    # serve's protocol is the baseline's plus the fast produce path, which needs a broker a bare app lacks
    assert issubclass(served.http, ours.http)
    assert served.http.header_timeout_s == ours.http.header_timeout_s
    assert served.http.fast is not None and not hasattr(ours.http, "fast")


def _burn_first() -> None:
    deadline = time.thread_time() + 0.3
    while time.thread_time() < deadline:
        pass


def _burn_second() -> None:
    deadline = time.thread_time() + 0.3
    while time.thread_time() < deadline:
        pass


def test_each_sampling_window_is_a_profile_of_its_own(tmp_path: Path) -> None:
    sampler = Sampler(interval=0.005)
    previous = signal.signal(signal.SIGPROF, sampler.on_prof)
    try:
        sampler.toggle()
        _burn_first()
        assert sampler.toggle()
        sampler.dump(tmp_path / "first.json")
        sampler.toggle()
        _burn_second()
        assert sampler.toggle()
        sampler.dump(tmp_path / "second.json")
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, previous)
    first = orjson.loads((tmp_path / "first.json").read_bytes())
    second = orjson.loads((tmp_path / "second.json").read_bytes())
    assert first["samples"] > 0 and second["samples"] > 0
    assert any("_burn_first" in label for _, label, _ in first["total"])
    assert not any("_burn_first" in label for _, label, _ in second["total"])
    assert any("_burn_second" in label for _, label, _ in second["total"])


def test_tiny_kafka_scenario_runs_kafkas_own_tools_against_both_brokers(tmp_path: Path) -> None:
    """A real Kafka broker from Maven Central's jars and lakebroker's listener, each loaded by Kafka's
    ProducerPerformance (acks=1 and acks=all) and read by ConsumerPerformance: every run completes
    (the tools fail when a record is not acknowledged or not read) and its figures are positive."""
    result = measure_in_process(scenario("kafka"), "tiny")
    produced = result.figures["produced"]
    assert sorted(produced) == ["kafka-acks1", "kafka-acksall", "lakebroker-acks1", "lakebroker-acksall"]
    assert all(run["records_s"] > 0 for runs in produced.values() for run in runs)
    assert all(c["records_s"] > 0 for c in result.figures["consumed"].values())
    assert [c.name for c in result.checks] == ["produce acks=1, over Kafka", "produce acks=all, over Kafka",
                                               "consume, over Kafka"]
