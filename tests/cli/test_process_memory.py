"""serve and its delivery process keep pandas out and allocate Arrow memory from jemalloc with a
short decay (tables/process_memory.py). pandas is installed in this environment (Airflow needs it),
so without the refusal pyarrow would import it on the first Delta read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.receivers import Receiver
from tests.servers import REPO, ServerProcess, delivery_child, until


def _python(code: str, pool: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = pool
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


CHECK = """
import json, pyarrow as pa
from lakebroker.tables.process_memory import keep_small
keep_small()
keep_small()  # idempotent
import pyarrow.dataset  # its import is what asks pyarrow's pandas shim first
try:
    import pandas
    refused = ""
except ImportError as exc:
    refused = str(exc)
pa.scalar(5)  # still works: pyarrow takes the refusal as "no pandas"
print(json.dumps({"refused": refused, "pool": pa.default_memory_pool().backend_name}))
"""


def test_keep_small_refuses_pandas_and_allocates_arrow_memory_from_jemalloc() -> None:
    import pandas  # noqa: F401  (installed here, so a refusal is the only way the import can fail)

    out = _python(CHECK, pool=None)
    assert "pandas is kept out of this lakebroker process" in str(out["refused"])
    assert out["pool"] == "jemalloc"


RELEASE = """
import json, time, pyarrow as pa
from lakebroker.tables.process_memory import keep_small
keep_small()
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) >> 10
before = anon()
buffers = []
for _ in range(100):  # 200 MB in 2 MB buffers, each page written so it is resident
    b = pa.allocate_buffer(2 << 20)
    memoryview(b).cast("B")[::4096] = b"\1" * 512
    buffers.append(b)
held = anon()
del buffers, b
deadline = time.monotonic() + 10
while anon() > before + 30 and time.monotonic() < deadline:
    pa.allocate_buffer(4096)  # activity: jemalloc purges as it allocates
    time.sleep(0.01)
print(json.dumps({"pool": pa.default_memory_pool().backend_name, "before": before, "held": held, "after": anon()}))
"""


def test_arrow_memory_freed_by_serve_goes_back_to_the_kernel() -> None:
    out = _python(RELEASE, pool=None)
    assert out["pool"] == "jemalloc"
    assert int(str(out["held"])) >= int(str(out["before"])) + 190  # the buffers were resident
    assert int(str(out["after"])) <= int(str(out["before"])) + 30, out  # and were returned, not kept


def test_an_operators_arrow_pool_choice_is_kept() -> None:
    assert _python(CHECK, pool="mimalloc")["pool"] == "mimalloc"


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_serve_and_its_delivery_process_read_delta_without_loading_pandas(tmp_path: Path) -> None:
    receiver = Receiver()
    env = {"LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1", "LAKEBROKER_FLUSH_INTERVAL_MS": "50"}
    server = ServerProcess(tmp_path / "data", env=env)
    try:
        client = httpx.Client(base_url=server.start(), timeout=30)
        assert client.post("/v1/topics", json={"name": "orders", "partitions": 2}).status_code == 201
        assert client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                                      "start": "earliest"}).status_code == 201
        assert client.post("/v1/topics/orders/messages?ack=table", json={"key": "k", "value": "one"}).status_code == 200
        r = client.post("/v1/topics/orders/batch?ack=table", json={"messages": [{"value": i} for i in range(20)]})
        assert r.status_code == 200, r.text
        read = client.get("/v1/topics/orders/partitions/0/messages", params={"offset": 0})
        assert read.status_code == 200 and read.json()["messages"], read.text
        receiver.wait_for(lambda: len(receiver.messages()) >= 21)

        assert server.proc is not None
        child = delivery_child(server)
        until(lambda: "pyarrow/_dataset" in _mapped(child), "the delivery process reads Delta", timeout=30)
        for pid in (server.proc.pid, child):
            maps = _mapped(pid)
            assert "pyarrow/_dataset" in maps, pid  # each read Delta through pyarrow.dataset ...
            assert "/pandas/" not in maps, pid  # ... which would have loaded pandas
    finally:
        server.stop()
        receiver.close()
