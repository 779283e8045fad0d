"""The client installs alone: a fresh venv gets `pip install ./clients/python` (pinned by
requirements.lock) and nothing of the server, then produces and consumes against a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.conftest import Broker
from tests.servers import REPO

SCRIPT = """
import json, sys
from lakebroker_client import Consumer, Producer, TopicPartition

url, token, topic = sys.argv[1:]
with Producer(url, token, value_serializer=lambda v: json.dumps(v).encode()) as producer:
    sent = [producer.send(topic, {"n": i}, key=f"user-{i}", ack="table").result(30) for i in range(5)]
with Consumer(url, topic, group_id="standalone", token=token) as consumer:
    got = []
    while len(got) < 5:
        got.extend(consumer.poll(timeout_s=5))
    committed = consumer.commit()
print(json.dumps({
    "sent": [[r.topic, r.partition, r.offset, r.timestamp.isoformat()] for r in sent],
    "got": [[m.topic, m.partition, m.offset, m.timestamp.isoformat(), m.key, json.loads(m.data)] for m in got],
    "committed": {f"{tp.topic}/{tp.partition}": o for tp, o in committed.items()},
}))
"""
TOP_LEVEL = "import importlib.metadata as m; print(m.distribution('lakebroker-client').read_text('top_level.txt'))"
SERVER_ONLY = {"pyspark", "fastapi", "deltalake", "pyarrow", "pydantic", "orjson", "uvicorn", "lakebroker"}


def pinned() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


@pytest.mark.slow
def test_the_client_installs_alone_and_produces_and_consumes(broker: Broker, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # No pip of its own (ensurepip is the slow part): this interpreter's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python]
    subprocess.run([*pip, "install", "--quiet", "--no-compile", "-c", str(REPO / "requirements.lock"),
                    str(REPO / "clients" / "python")], check=True, env=env, cwd=tmp_path)

    listed = subprocess.run([*pip, "list", "--format=json"], check=True, env=env, capture_output=True, text=True).stdout
    installed = {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(listed)}
    assert not SERVER_ONLY & set(installed), f"server packages in the client's venv: {SERVER_ONLY & set(installed)}"
    assert {"lakebroker-client", "httpx", "standardwebhooks", "tenacity"} <= set(installed)
    isolated = subprocess.run([python, "-c", "import lakebroker"], env=env, cwd=tmp_path, capture_output=True)
    assert isolated.returncode != 0, "the venv sees the repository's server packages"
    top_level = subprocess.run([python, "-c", TOP_LEVEL], env=env, cwd=tmp_path, capture_output=True, text=True,
                               check=True).stdout
    assert top_level.split() == ["lakebroker_client"], top_level
    pins = pinned()
    for name, version in installed.items():
        if name not in ("pip", "setuptools", "lakebroker-client"):
            assert pins.get(name) == version, f"{name} {version} is not the version requirements.lock pins"

    topic = broker.create_topic("standalone", partitions=3)
    run = subprocess.run([python, "-c", SCRIPT, broker.url, broker.token or "", topic], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    sent = {(t, p, o): ts for t, p, o, ts in out["sent"]}
    assert len(sent) == 5 and all(t == topic for t, _, _ in sent)
    assert {(t, p, o): ts for t, p, o, ts, _, _ in out["got"]} == sent, "each message read back once, same timestamp"
    assert sorted((key, value["n"]) for *_, key, value in out["got"]) == [(f"user-{i}", i) for i in range(5)]
    assert sum(out["committed"].values()) == 5
