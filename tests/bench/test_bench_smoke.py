"""The benchmark harness in its tiny mode: it runs end to end and writes a complete report.

No timing is asserted: the figures of a few-second run on a shared machine mean nothing. What
is checked is that every benchmark produced positive numbers, the markdown holds every section
and the plots, fragments from other engineers' modules are merged, and docs/benchmarks.md is
left alone (everything goes to tmp_path).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import orjson
import pytest
import uvicorn

from bench import baseline_app
from bench.procs import REPO
from bench.run import External, external_fragment, run
from bench.sampler import Sampler

pytestmark = pytest.mark.timeout(300)

REAL_REPORT = REPO / "docs" / "benchmarks.md"


def _snapshot(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def test_tiny_run_writes_every_section_with_positive_figures(tmp_path: Path) -> None:
    before = _snapshot(REAL_REPORT)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "benchmarks-spark.md").write_text("# Spark jobs\n\nspark-fragment-marker\n")
    out = docs / "benchmarks.md"

    results = run("tiny", out, docs / "img", docs, external=False, command="pytest tests/bench")

    assert results.errors == []
    assert results.single is not None and results.single.points
    for point in results.single.points:
        assert point.baseline.rps > 0 and point.broker.ok_rps > 0 and point.broker.cpu_s > 0
    assert all(m.rps > 0 for _, m in results.single.decomposition)
    assert results.batch is not None and all(row.msg_s > 0 for row in results.batch.rows)
    assert results.batch.server_metrics["lakebroker_flush_batch_records_sum"] > 0
    assert results.flush and all(r.flush_rows_s > 0 and r.floor_rows_s > 0 for r in results.flush)
    assert results.visibility
    for v in results.visibility:
        assert v.acked > 0 and v.not_visible == 0
        assert v.visible_s and min(v.visible_s) > 0
    assert results.profiles and all(s.samples > 0 and s.main_seconds > 0 for s in results.profiles)
    # serve's peak RSS in each benchmark's server: a real reading (a Python process is tens of MB).
    peaks = [results.single.peak_rss_mb, results.batch.peak_rss_mb, *(v.peak_rss_mb for v in results.visibility)]
    assert all(mb is not None and 20 < mb < 24_000 for mb in peaks), peaks

    text = out.read_text()
    for heading in ("## Summary", "## 1. Single-message produce", "## 2. Batch produce", "## 3. WAL→Delta flush",
                    "## 4. Produce → visible in Delta", "## Profiles of the server under load",
                    "## How it was measured", "## Machine", "## Spark jobs"):
        assert heading in text
    assert "spark-fragment-marker" in text
    assert "| 7. ingest memory: serve's peak RSS | single produce " in text
    assert text.count("## Spark jobs") == 1  # the fragment's own "# Spark jobs" is not a second heading
    for png in ("produce_throughput.png", "produce_to_table_cdf.png"):
        assert (docs / "img" / png).stat().st_size > 1000
        assert f"img/{png}" in text
    assert _snapshot(REAL_REPORT) == before


def test_an_external_module_is_run_and_a_fragment_file_is_the_fallback(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fake_bench_ok.py").write_text("def run(quick):\n    return f'# Fake\\n\\nquick={quick}'\n")
    (tmp_path / "fake_bench_broken.py").write_text("def run(quick):\n    raise RuntimeError('no spark here')\n")
    (tmp_path / "broken.md").write_text("# Old figures\n\nfrom-the-file\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}"}

    ok = external_fragment(External("fake_bench_ok", "none.md", "Fake"), tmp_path, True, 60, env=env)
    assert ok == ("Fake", "quick=True")  # the fragment's own "# Fake" title is the section's heading

    broken = external_fragment(External("fake_bench_broken", "broken.md", "Broken"), tmp_path, True, 60, env=env)
    assert broken is not None and "from-the-file" in broken[1] and "failed" in broken[1]

    missing = external_fragment(External("no_such_bench_module", "absent.md", "Absent"), tmp_path, True, 60)
    assert missing is None


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
