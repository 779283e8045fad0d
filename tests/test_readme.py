"""The README stays true to the code: its dependency table and the quickstart's curl examples, which
docs/getting-started.md shows too (the CLI quickstart runs in tests/cli/test_quickstart.py; the
links into docs/, in tests/test_docs.py)."""

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
from standardwebhooks import Webhook

from lakebroker.ingest_api.partitioner import partition_for_key
from tests.markdown_blocks import code_blocks
from tests.receivers import Receiver
from tests.servers import ServerProcess

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "getting-started.md"


def between(marker: str) -> str:
    return README.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


def test_the_readme_stays_short() -> None:
    """The README is for someone deciding whether to adopt the broker; reference belongs in docs/."""
    assert len(README.splitlines()) <= 300


def test_the_readmes_figures_are_the_benchmark_pages() -> None:
    """Every measured figure the README quotes (a number with a thousands separator, or a ratio
    like 0.58x) is on docs/benchmarks.md, which make bench renders from its results."""
    section = README.split("## Performance", 1)[1].split("\n## ", 1)[0]
    page = (Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md").read_text()
    figures = set(re.findall(r"\b\d{1,3}(?:,\d{3})+\b|\b\d+\.\d\dx", section))
    assert len(figures) >= 10, figures
    missing = sorted(f for f in figures if f not in page)
    assert not missing, f"figures in the README that docs/benchmarks.md does not hold: {missing}"


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
    # docs/getting-started.md shows the same block, marked as run here.
    shown = [b.text for b in code_blocks(GUIDE) if b.tested_by == "tests/test_readme.py"]
    assert shown == [between("quickstart-http").split("```bash\n", 1)[1].split("```", 1)[0]], GUIDE
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
