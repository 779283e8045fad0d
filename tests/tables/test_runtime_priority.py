"""delta-rs's runtime threads run below the server's priority; Python's threads keep theirs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from lakebroker.tables.runtime_priority import TOKIO_THREAD_NAMES, RuntimePriority
from tests.servers import ServerProcess, until

ROOT = Path(__file__).resolve().parents[2]


def _threads(pid: int | str = "self") -> dict[int, tuple[str, int]]:
    """Each thread of a process: its name and niceness (field 19 of /proc/<pid>/task/<tid>/stat)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().rstrip("\n")
        except FileNotFoundError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ", whose comm may hold spaces
        out[int(task.name)] = (name, int(fields[16]))
    return out


def test_lowering_finds_the_runtime_threads_and_leaves_pythons_alone(tmp_path: Path) -> None:
    """In a process of its own, so this test's process keeps its threads as they were. A second
    pass sets nothing again."""
    code = f"""
import os, threading, pyarrow as pa, deltalake
from lakebroker.tables.runtime_priority import lower_runtime_threads
before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
deltalake.write_deltalake({str(tmp_path / 't')!r}, pa.table({{"x": [1]}}))
done = set()
first = lower_runtime_threads(7, done)
again = lower_runtime_threads(7, done)
print(len(first), len(again), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) - before)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    first, again, main = map(int, out)
    assert first >= 1, "no tokio thread was lowered after a delta-rs write"
    assert again == 0, "threads already lowered were set again"
    assert main == 0, "the Python thread that asked was lowered too"


def test_lowering_is_throttled_and_off_at_zero() -> None:
    clock = [0.0]
    assert not RuntimePriority(0, clock=lambda: clock[0]).refresh()
    on = RuntimePriority(5, clock=lambda: clock[0])
    assert on.refresh()
    clock[0] = 0.5
    assert not on.refresh()  # within the second
    clock[0] = 1.0
    assert on.refresh()


def test_a_serving_broker_runs_delta_rs_below_its_event_loop(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", env={"LAKEBROKER_DELTA_THREADS_NICE": "9",
                                                   "LAKEBROKER_FLUSH_INTERVAL_MS": "50"})
    url = server.start()
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the server's own niceness: this process's, inherited
    try:
        assert server.proc is not None
        pid = server.proc.pid
        httpx.post(f"{url}/v1/topics", json={"name": "t", "partitions": 2}, timeout=30).raise_for_status()
        r = httpx.post(f"{url}/v1/topics/t/batch?ack=table", json={"messages": [{"value": "x"}] * 100}, timeout=60)
        r.raise_for_status()

        def lowered() -> bool:
            threads = _threads(pid).values()
            tokio = [nice for name, nice in threads if name in TOKIO_THREAD_NAMES]
            return bool(tokio) and all(nice == max(9, base) for nice in tokio)

        until(lowered, "delta-rs's threads at niceness 9", timeout=30)
        others = {name: nice for name, nice in _threads(pid).values() if name not in TOKIO_THREAD_NAMES}
        assert _threads(pid)[pid][1] == base, "the event loop's thread was lowered"
        assert set(others.values()) == {base}, others
    finally:
        server.stop()
