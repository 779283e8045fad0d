"""The README stays true to the code: settings, metrics and the quickstart."""

from __future__ import annotations

import re
import time
from pathlib import Path

from fastapi.testclient import TestClient

from scripts.settings_table import rows
from tests.receivers import Receiver

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def between(marker: str) -> str:
    return README.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


def test_every_setting_is_in_the_readme_table() -> None:
    assert between("settings").strip().splitlines() == rows()


def test_every_metric_in_the_readme_appears_after_produce_and_deliver(client: TestClient, orders: str) -> None:
    names = re.findall(r"^\| `(lakebroker_[a-z_]+)`", between("metrics"), flags=re.M)
    assert len(names) >= 20
    receiver = Receiver(behaviour=lambda n, body: (500, {}, 0.0) if body["offset"] == 0 else (200, {}, 0.0))
    try:
        client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                               "start": "earliest", "max_attempts": 1})
        client.post("/v1/topics/orders/batch?ack=table",
                    json={"messages": [{"value": i, "partition": 0, "id": f"m{i}"} for i in range(5)]})
        client.post("/v1/topics/orders/messages", json={"value": 0, "partition": 0, "id": "m0"})  # a duplicate
        client.post("/v1/topics/orders/messages", json={"value": 1, "partition": 7})  # rejected
        receiver.wait_for(lambda: len(receiver.messages()) == 4)
        deadline = time.monotonic() + 10
        text = ""
        while time.monotonic() < deadline:
            text = client.get("/metrics").text
            if 'lakebroker_dead_lettered_messages_total{subscription="hooks"} 1.0' in text:
                break
            time.sleep(0.1)
    finally:
        receiver.close()
    samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for name in names:
        kinds = {name, f"{name}_bucket"}
        assert kinds & samples, f"{name} has no sample in /metrics"
    assert 'lakebroker_dead_lettered_messages_total{subscription="hooks"} 1.0' in text
    assert 'lakebroker_delivered_messages_total{subscription="hooks"} 4.0' in text


def test_every_declared_dependency_is_explained_in_the_readme() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["dev"]
    names = {re.split(r"[\[<>=!~ ]", spec, maxsplit=1)[0].lower() for spec in declared}
    table = README.split("## Dependencies", 1)[1].split("\n## ", 1)[0]
    explained = {name.lower() for name in re.findall(r"`([A-Za-z0-9_.-]+)(?:\[[a-z,]+\])?`", table)}
    assert names - explained == set(), "add these to the README's dependency table, with why"
