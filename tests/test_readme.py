"""The README stays true to the code: settings, metrics, dependencies and the quickstart's curl examples."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from lakebroker.ingest_api.partitioner import partition_for_key
from scripts.settings_table import rows
from tests.receivers import Receiver
from tests.servers import ServerProcess
from tests.waiting import eventually

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
        assert client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                                      "start": "earliest", "max_attempts": 1}).status_code == 201
        assert client.post("/v1/topics/orders/batch?ack=table", json={
            "messages": [{"value": i, "partition": 0, "id": f"m{i}"} for i in range(5)]}).status_code == 200
        duplicate = client.post("/v1/topics/orders/messages", json={"value": 0, "partition": 0, "id": "m0"})
        assert duplicate.json()["duplicate"] is True
        rejected = client.post("/v1/topics/orders/messages", json={"value": 1, "partition": 7})
        assert rejected.status_code == 400, rejected.text
        receiver.wait_for(lambda: len(receiver.messages()) == 4)
        # The receiver records a message before its 2xx reaches the worker, which counts it then.
        settled = ('lakebroker_dead_lettered_messages_total{subscription="hooks"} 1.0',
                   'lakebroker_delivered_messages_total{subscription="hooks"} 4.0')
        text = eventually(lambda: (t := client.get("/metrics").text) and all(s in t for s in settled) and t, 10,
                          what=f"the settled samples {settled}", interval=0.1)
    finally:
        receiver.close()
    samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for name in names:
        kinds = {name, f"{name}_bucket"}
        assert kinds & samples, f"{name} has no sample in /metrics"
    assert 'lakebroker_dead_lettered_messages_total{subscription="hooks"} 1.0' in text
    assert 'lakebroker_delivered_messages_total{subscription="hooks"} 4.0' in text


def test_every_declared_dependency_is_explained_in_the_readme_under_its_extra() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    groups = {"runtime": project["dependencies"], **project["optional-dependencies"]}
    table = README.split("## Dependencies", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and " | " in line]
    placed: dict[str, set[str]] = {}  # package -> the groups whose rows name it
    for group, dependency, *_ in rows:
        for name in re.findall(r"`([A-Za-z0-9_.-]+)(?:\[[a-z,]+\])?`", dependency):
            placed.setdefault(name.lower(), set()).add(group.removeprefix("| "))
    for group, specs in groups.items():
        names = {re.split(r"[\[<>=!~ ]", spec, maxsplit=1)[0].lower() for spec in specs}
        names.discard("lakebroker")  # dev = lakebroker[spark,airflow] + its own
        wrong = {name: sorted(placed.get(name, ())) for name in names if placed.get(name) != {group}}
        assert not wrong, f"README's dependency table: put these in a row of group {group!r}, with why: {wrong}"


# -- the quickstart's curl examples, run with curl against a real `lakebroker serve` -------------
@dataclass
class Step:
    argv: list[str]
    status: int
    body: str


def curl_steps() -> list[Step]:
    """The curl commands of the quickstart-http block, each with the `# -> STATUS BODY` it states.
    `# the same request again -> ...` runs the command before it once more."""
    block = between("quickstart-http").split("```bash", 1)[1].split("```", 1)[0]
    steps: list[Step] = []
    command: list[str] | None = None
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("curl "):
            command = shlex.split(line)
            continue
        said = re.fullmatch(r"#(?: the same request again)? -> (\d{3}) (.+)", line)
        assert said and command is not None, f"not a command or a stated output: {line!r}"
        steps.append(Step(command, int(said[1]), said[2]))
    return steps


def matches(stated: Any, actual: Any) -> bool:
    """A stated value equals the actual one, except "x..." (a prefix) and dicts stated with `...`
    (checked by subset: see `stated_body`)."""
    if isinstance(stated, str) and stated.endswith("..."):
        return isinstance(actual, str) and actual.startswith(stated[:-3])
    if isinstance(stated, dict):
        return isinstance(actual, dict) and all(k in actual and matches(v, actual[k]) for k, v in stated.items())
    return bool(stated == actual)


def stated_body(text: str) -> tuple[dict[str, Any], bool]:
    """The stated JSON body, and whether it lists every field (no trailing `, ...}`)."""
    whole = not text.endswith(", ...}")
    return orjson.loads(text if whole else text[: -len(", ...}")] + "}"), whole


@pytest.fixture(scope="module")
def http_quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Receiver]]:
    """One `lakebroker serve` for the module (loopback: the webhook goes to a local receiver)."""
    root = tmp_path_factory.mktemp("readme-http")
    server = ServerProcess(root / "data", env={"LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "true",
                                               "LAKEBROKER_DELIVERY_POLL_MS": "20"})
    receiver = Receiver()
    try:
        yield server.start(), receiver
    finally:
        server.stop()
        receiver.close()


def test_readme_curl_examples_answer_what_the_readme_states(http_quickstart: tuple[str, Receiver]) -> None:
    url, receiver = http_quickstart
    steps = curl_steps()
    assert len(steps) == 5 and sum("/v1/subscriptions" in " ".join(s.argv) for s in steps) == 1
    host = url.removeprefix("http://")
    answers: list[dict[str, Any]] = []
    for step in steps:
        argv = [arg.replace("localhost:8080", host).replace("https://billing.example.com/hook", receiver.url)
                for arg in step.argv]
        assert argv[0] == "curl" and argv != step.argv
        done = subprocess.run([*argv, "-w", "\n%{http_code}"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        body, status = done.stdout.rsplit("\n", 1)
        actual = orjson.loads(body)
        stated, whole = stated_body(step.body)
        assert int(status) == step.status, (step.argv, status, body)
        assert matches(stated, actual) and (not whole or set(stated) == set(actual)), (step.body, body)
        answers.append(actual)
    assert partition_for_key("user-7", 6) == 2  # the README's claim is Kafka's murmur2, not a coincidence

    # The hook gets both messages, in offset order, signed with the secret the answer showed once.
    receiver.wait_for(lambda: len(receiver.messages()) >= 2)
    verifier = Webhook(answers[-1]["secret"])
    envelopes = [verifier.verify(r.body, r.headers) for r in receiver.received]
    assert [(e["partition"], e["offset"], e["key"], e["value"]) for e in envelopes] == [
        (2, 0, "user-7", {"amount": 42}), (2, 1, "user-7", {"amount": 7})]


# -- the Spark jobs table ------------------------------------------------------------------------
def spark_jobs_table() -> list[dict[str, str]]:
    """The README's Spark-jobs table, one dict per row, keyed by the header's columns."""
    lines = between("spark-jobs").strip().splitlines()
    split = lambda line: [cell.strip() for cell in line.strip().strip("|").split("|")]  # noqa: E731
    header = split(lines[0])
    return [dict(zip(header, split(line), strict=True)) for line in lines[2:]]


def test_the_spark_jobs_table_matches_the_jobs_the_cli_and_the_scheduler() -> None:
    import typer
    import typer.main

    from lakebroker import jobs_cli
    from lakebroker.spark_pipeline.scheduler import JOBS
    from lakebroker.tables.settings import Settings

    table = spark_jobs_table()
    modules = {row["module"].strip("`"): row for row in table}
    job_files = {p.stem for p in (Path(__file__).resolve().parent.parent / "spark_pipeline" / "jobs").glob("*.py")}
    assert set(modules) == job_files - {"__init__", "common"}, "every job module has a row, and only they"

    scheduled = {spec.module.rsplit(".", 1)[1]: spec for spec in JOBS}
    for module, row in modules.items():
        spec = scheduled.get(module)
        if spec is None:  # not a scheduled job (verify_replica): no DAG, no interval
            assert row["Airflow DAG (schedule)"] == row["in `serve`: setting (default)"] == "none", module
            continue
        default = Settings.model_fields[spec.interval_setting].default
        assert row["in `serve`: setting (default)"].startswith(f"`{spec.interval_setting}` ({default})"), module
        assert row["Airflow DAG (schedule)"].startswith(f"`lakebroker_{module}` ("), module  # run in tests/airflow_dags
        assert row["job"].replace(" ", "-") == spec.job.value, module

    app = typer.Typer()
    jobs_cli.register(app, Settings, lambda message, code: typer.Exit(code))  # as `lakebroker` registers them
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for row in table:
        words = row["CLI"].strip("`").split()
        assert words[0] == "lakebroker" and words[1] in commands, row["CLI"]
        options = {opt for param in commands[words[1]].params for opt in param.opts}
        named = set(re.findall(r"--[a-z-]+", row["CLI"]))
        assert named <= options, (row["CLI"], named - options)
