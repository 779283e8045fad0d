"""docs/ stays true to the code: the reference pages are what scripts/reference_pages.py generates from
it, and every metric they list appears in a real /metrics; the pages that list what the code defines
(the Spark jobs, offset reasons, the jobs' command lines, what replication copies) match it; every
link between the README and the docs resolves; and every code block of the guides is run by a test
or marked illustrative. (The SQL of docs/analysts.md runs in tests/spark_pipeline/test_analysts.py,
the guides' marked examples in tests/test_guides.py; the README's own checks are in
tests/test_readme.py.)"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lakebroker.ingest_api.kafka.listener import KafkaListener
from lakebroker.ingest_api.node import IngestNode
from lakebroker.server import build_app, kafka_listener
from lakebroker.tables.job_runs import JobName
from lakebroker.tables.offsets import OffsetReason
from lakebroker.tables.settings import Settings
from scripts import reference_pages
from tests.kafka_wire import KafkaConnection, partition_answer, produce, record_batch
from tests.markdown_blocks import code_blocks
from tests.receivers import Receiver
from tests.waiting import eventually

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
ANALYSTS = (DOCS / "analysts.md").read_text()
OPERATIONS = (DOCS / "operations.md").read_text()
CONFIGURATION = (DOCS / "reference" / "configuration.md").read_text()
METRICS = (DOCS / "reference" / "metrics.md").read_text()
SPARK_JOBS = (DOCS / "spark-jobs.md").read_text()


def between(text: str, marker: str) -> str:
    return text.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


# -- the generated reference pages ---------------------------------------------------------------
def test_the_reference_pages_are_what_the_code_generates() -> None:
    stale = sorted(reference_pages.stale())
    assert not stale, f"docs/reference/ pages out of date with the code: {stale}; run python -m scripts.reference_pages"
    for page in (DOCS / "reference").glob("*.md"):
        assert page.name in reference_pages.PAGES, f"{page.name} is not generated: put hand-written pages outside"
        assert page.read_text().startswith(reference_pages.header("")[:40]), page


def test_every_setting_is_in_the_configuration_page() -> None:
    listed = re.findall(r"^\| `([a-z_]+)` \| `LAKEBROKER_([A-Z_]+)` \|", CONFIGURATION, flags=re.M)
    assert [(name, env.lower()) for name, env in listed] == [(name, name) for name in Settings.model_fields]


def metric_names(*sections: str) -> list[str]:
    return [name for section in sections
            for name in re.findall(r"^\| `(lakebroker_[a-z_]+)`", between(METRICS, f"metrics:{section}"), flags=re.M)]


def test_the_metrics_page_lists_every_family_serve_registers(tmp_path: Path) -> None:
    """The page's ingest, delivery-process and job sections are exactly the registry `serve` builds
    (lakebroker/server.py: the job collector, then build_app with the delivery process)."""
    from prometheus_client import CollectorRegistry

    from lakebroker.spark_pipeline.metrics import JobMetricsCollector
    from lakebroker.tables.layout import Layout

    settings = Settings(data_dir=tmp_path / "data")
    registry = CollectorRegistry()
    registry.register(JobMetricsCollector(Layout.of(settings)))
    build_app(settings, registry)
    families = {name for name, *_ in reference_pages._families(registry)}
    assert len(families) >= 20
    assert sorted(families) == sorted(metric_names("ingest", "delivery-process", "jobs"))


@pytest.fixture
def with_kafka(settings: Settings) -> Iterator[tuple[TestClient, KafkaListener]]:
    """The app as serve builds it, with its Kafka listener (on a free port)."""
    node = IngestNode.build(settings.model_copy(update={"kafka_port": 0}))
    kafka = kafka_listener(node.settings, node)
    assert kafka is not None
    with TestClient(build_app(node.settings, node=node, kafka=kafka)) as client:
        yield client, kafka


def test_every_metric_in_the_metrics_page_appears_after_produce_and_deliver(
        with_kafka: tuple[TestClient, KafkaListener]) -> None:
    client, kafka = with_kafka
    names = metric_names("ingest", "delivery")  # what serve's /metrics shows, with its delivery worker in process
    assert len(names) >= 20
    assert client.post("/v1/topics", json={"name": "orders", "partitions": 3}).status_code == 201
    receiver = Receiver(behaviour=lambda n, body: (500, {}, 0.0) if body["offset"] == 0 else (200, {}, 0.0))
    try:
        with KafkaConnection(f"127.0.0.1:{kafka.port}") as conn:  # a refused partition, then garbage
            assert partition_answer(conn.call(produce("orders", 9, record_batch([b"v"])))).error_code != 0
            conn.send_raw(b"\xff" * 16)
            assert conn.closed_by_peer()
        assert client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                                      "start": "earliest", "max_attempts": 1}).status_code == 201
        assert client.post("/v1/topics/orders/batch?ack=table", json={
            "messages": [{"value": i, "partition": 0, "id": f"m{i}"} for i in range(5)]}).status_code == 200
        duplicate = client.post("/v1/topics/orders/messages", json={"value": 0, "partition": 0, "id": "m0"})
        assert duplicate.json()["duplicate"] is True
        rejected = client.post("/v1/topics/orders/messages", json={"value": 1, "partition": 7})
        assert rejected.status_code == 400, rejected.text
        assert client.post("/v1/topics/orders/groups/audit/offsets", json={"offsets": {"0": 2}}).status_code == 200
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


def test_analysts_lists_every_offset_reason() -> None:
    table = ANALYSTS.split("| reason | written when |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([a-z-]+)` \|", table, flags=re.M)
    assert sorted(listed) == sorted(r.value for r in OffsetReason)


def test_operations_job_command_lines_are_real(capsys: pytest.CaptureFixture[str]) -> None:
    lines = re.findall(r"^python -m lakebroker\.spark_pipeline\.jobs\.(\w+) +(.*)$", OPERATIONS, flags=re.M)
    modules = {module for module, _ in lines}
    assert {job.value.replace("-", "_") for job in JobName} | {"verify_replica"} == modules
    for module, options in lines:
        with pytest.raises(SystemExit) as done:
            importlib.import_module(f"lakebroker.spark_pipeline.jobs.{module}").main(["--help"])
        assert done.value.code == 0
        usage = capsys.readouterr().out
        for option in re.findall(r"--[a-z-]+", options):
            assert option in usage, (module, option)


def test_operations_says_which_tables_replication_copies() -> None:
    from lakebroker.spark_pipeline.jobs.replication import SNAPSHOT_TABLES

    sentence = OPERATIONS.split("It copies every topic table and the system tables", 1)[1].split(". It does", 1)[0]
    assert set(re.findall(r"`(\w+)`", sentence)) == {*SNAPSHOT_TABLES, "consumer_offsets"}
    assert "tokens" in SNAPSHOT_TABLES  # the failover procedure counts on the clients' tokens coming along


# -- the Spark jobs table of docs/spark-jobs.md --------------------------------------------------
def spark_jobs_table() -> list[dict[str, str]]:
    """docs/spark-jobs.md's table of jobs, one dict per row, keyed by the header's columns."""
    lines = between(SPARK_JOBS, "spark-jobs").strip().splitlines()
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
    job_files = {p.stem for p in (REPO / "spark_pipeline" / "jobs").glob("*.py")}
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


# -- links between the README and the docs -------------------------------------------------------
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "clients" / "python" / "README.md",
         *sorted(DOCS.glob("*.md")), *sorted((DOCS / "reference").glob("*.md")),
         *sorted((DOCS / "decisions").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", prose(page.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def prose(text: str) -> str:
    """The text without its fenced code blocks, whose `#` lines and brackets are not Markdown."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: links that lead nowhere: {broken}"


# -- the code blocks of the guides --------------------------------------------------------------
GUIDES = [page for page in sorted(DOCS.glob("*.md")) if page.name != "benchmarks.md"]  # rendered by make bench


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_every_code_block_of_the_guides_runs_in_a_test_or_is_marked_illustrative(page: Path) -> None:
    """The line before each block says `<!-- illustrative -->`, or `<!-- tested: tests/<file>.py -->`
    naming a test that reads this page (docs/contributing.md, "The documentation")."""
    problems = []
    for block in code_blocks(page):
        if block.language == "mermaid":  # a diagram the site draws, not code
            continue
        where = f"line {block.line}"
        if not block.fenced:
            problems.append(f"{where}: an indented code block; make it a fenced one, and mark it")
        elif block.marker is None:
            problems.append(f"{where}: put <!-- illustrative --> or <!-- tested: tests/<file>.py --> before it")
        elif block.tested_by is not None:
            test = REPO / block.tested_by
            if not test.is_file() or page.name not in test.read_text():
                problems.append(f"{where}: {block.tested_by} does not read {page.name}")
    assert not problems, f"docs/{page.name}: {problems}"


def test_the_producers_guide_figures_are_the_benchmark_pages() -> None:
    """The throughput table of docs/producing.md quotes docs/benchmarks.md, which make bench renders."""
    guide = (DOCS / "producing.md").read_text()
    table = guide.split("<!-- figures: docs/benchmarks.md -->", 1)[1].split("<!-- /figures -->", 1)[0]
    figures = set(re.findall(r"\b\d{1,3}(?:,\d{3})+\b", table))
    assert len(figures) == 4, figures
    page = (DOCS / "benchmarks.md").read_text()
    assert not sorted(f for f in figures if f not in page), "figures docs/benchmarks.md does not hold"
