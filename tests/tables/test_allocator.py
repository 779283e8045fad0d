"""delta-rs's jemalloc, and Arrow's, get lakebroker's settings in every process that imports `tables`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakebroker.tables import ARROW_MALLOC_CONF, DELTA_RS_MALLOC_CONF

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("_RJEM_MALLOC_CONF", "JE_ARROW_MALLOC_CONF")}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120, check=True)


def test_jemalloc_reads_the_settings_tables_puts_in_the_environment(tmp_path: Path) -> None:
    """jemalloc reads its variable at its first allocation, so setting it from Python works only if
    that happens before deltalake's first allocation. `stats_print` makes jemalloc print the options
    it runs with at exit."""
    code = f"""
import os, lakebroker.tables
os.environ["_RJEM_MALLOC_CONF"] += ",stats_print:true"
import pyarrow as pa, deltalake
deltalake.write_deltalake({str(tmp_path / 't')!r}, pa.table({{"x": [1, 2]}}))
"""
    stats = _python(code).stderr
    assert "jemalloc statistics" in stats, stats[-2000:]
    assert "opt.narenas: 1\n" in stats
    assert "opt.tcache_max: 4096\n" in stats


def test_arrows_jemalloc_reads_the_settings_tables_puts_in_the_environment() -> None:
    """Arrow's jemalloc reads its variable when pyarrow loads; `stats_print` makes it print the
    options it runs with at exit."""
    code = """
import os, lakebroker.tables
os.environ["JE_ARROW_MALLOC_CONF"] += ",stats_print:true"
import pyarrow as pa
pa.set_memory_pool(pa.jemalloc_memory_pool())
pa.allocate_buffer(1 << 20)
"""
    stats = _python(code).stderr
    assert "jemalloc statistics" in stats, stats[-2000:]
    assert "opt.dirty_decay_ms: 100 " in stats
    assert "opt.muzzy_decay_ms: 100 " in stats
    assert "opt.background_thread: true" in stats  # Arrow's own setting stays: purges happen off the event loop


@pytest.mark.parametrize("library", ["deltalake", "pyarrow"])
@pytest.mark.parametrize("entry", ["lakebroker.cli", "lakebroker.ingest_api.app", "lakebroker.delivery_worker.worker",
                                   "lakebroker.spark_pipeline.jobs.compaction"])
def test_every_entry_point_imports_tables_before_the_libraries_it_configures(entry: str, library: str) -> None:
    """-X importtime lists a module when its import finishes: `tables` (which sets the variables)
    must finish before `library` starts, which it does only if nothing imports the library first."""
    lines = _python(f"import {entry}", PYTHONPROFILEIMPORTTIME="1").stderr.splitlines()
    finished = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]
    first = min(i for i, name in enumerate(finished) if name.split(".")[0] == library)
    assert "lakebroker.tables" in finished[:first], f"{entry} imports {library} before lakebroker.tables"


def test_a_users_own_setting_wins() -> None:
    delta_rs = "import os, lakebroker.tables; print(os.environ['_RJEM_MALLOC_CONF'])"
    assert _python(delta_rs, _RJEM_MALLOC_CONF="narenas:2").stdout.strip() == "narenas:2"
    assert _python(delta_rs).stdout.strip() == DELTA_RS_MALLOC_CONF
    arrow = "import os, lakebroker.tables; print(os.environ['JE_ARROW_MALLOC_CONF'])"
    assert _python(arrow, JE_ARROW_MALLOC_CONF="dirty_decay_ms:5000").stdout.strip() == "dirty_decay_ms:5000"
    assert _python(arrow).stdout.strip() == ARROW_MALLOC_CONF
