"""The `lakebroker` command line.

Every command answers bad input with a one-line reason on stderr and a non-zero exit
(1 for a refused request, 2 for a malformed command line), never a traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from lakebroker.access import broker_access
from lakebroker.console import err, out, print_rows
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.output import OutputFormat
from lakebroker.spark_pipeline.extra import SPARK_MODULES, missing_spark_message
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.layout import Layout, validate_name
from lakebroker.tables.logs import exit_without_teardown
from lakebroker.tables.message_format import from_json_value
from lakebroker.tables.settings import AuthMode, Settings
from lakebroker.tables.topics import CleanupPolicy, TopicStore

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="lakebroker: a message broker whose log is a Delta Lake table.")
topics_app = typer.Typer(no_args_is_help=True, help="Create, list, describe and delete topics.")
app.add_typer(topics_app, name="topics")


class _State:
    settings: Settings


state = _State()


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def print_version(wanted: bool) -> None:
    if wanted:
        try:
            number = version("lakebroker")
        except PackageNotFoundError:  # run from a source tree that was never installed
            number = "unknown (not installed)"
        print(f"lakebroker {number}")
        raise typer.Exit()


@app.callback()
def main_options(
    data_dir: Annotated[Path | None, typer.Option("--data-dir", envvar="LAKEBROKER_DATA_DIR",
                                                  help="Data directory (default ./data).")] = None,
    _version: Annotated[bool, typer.Option("--version", callback=print_version, is_eager=True,
                                           help="Print the version and exit.")] = False,
) -> None:
    overrides: dict[str, Any] = {} if data_dir is None else {"data_dir": data_dir}
    try:
        state.settings = Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise fail(f"bad setting {'.'.join(str(p) for p in first['loc'])}: {first['msg']}", 2) from None


def settings() -> Settings:
    return state.settings


# -- topics ---------------------------------------------------------------------------------
@topics_app.command("create")
def topics_create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1, max=1024)] = 3,
    retention_ms: Annotated[int | None, typer.Option(help="Delete messages older than this.")] = None,
    retention_bytes: Annotated[int | None, typer.Option(help="Keep at most this many bytes per partition.")] = None,
    cleanup_policy: Annotated[CleanupPolicy, typer.Option(
        help="delete: retention by time and size; compact: keep the latest value per key.")] = CleanupPolicy.DELETE,
    max_message_bytes: Annotated[int | None, typer.Option()] = None,
) -> None:
    """Create a topic (and its Delta table)."""
    config: dict[str, Any] = {"cleanup_policy": cleanup_policy.value,
                              "max_message_bytes": max_message_bytes or settings().default_max_message_bytes}
    if retention_ms is not None:
        config["retention_ms"] = retention_ms
    if retention_bytes is not None:
        config["retention_bytes"] = retention_bytes
    with broker_access(settings()) as broker:
        topic = broker.create_topic(name, partitions, config)
    out.print(f"created topic {topic['name']} with {topic['partitions']} partitions", highlight=False)


@topics_app.command("list")
def topics_list() -> None:
    """List topics and their configuration."""
    topics = TopicStore(Layout.of(settings())).load()
    print_rows(
        ["name", "partitions", "cleanup_policy", "retention_ms", "retention_bytes", "max_message_bytes"],
        [[t.name, t.partitions, t.cleanup_policy.value, t.retention_ms, t.retention_bytes, t.max_message_bytes]
         for t in sorted(topics.values(), key=lambda t: t.name)],
    )


@topics_app.command("describe")
def topics_describe(name: str) -> None:
    """Show a topic's configuration and each partition's offsets, size and files."""
    from lakebroker.ingest_api.reader import open_topic_table
    from lakebroker.tables.log_start import partition_logs

    layout = Layout.of(settings())
    topic = TopicStore(layout).get(name)
    out.print(", ".join(f"{k}={v}" for k, v in topic.public().items()), highlight=False, soft_wrap=True)
    table = open_topic_table(layout, topic)
    logs = {} if table is None else partition_logs(table, topic.partitions)  # one snapshot
    rows = []
    for p in range(topic.partitions):
        f = logs.get(p)
        rows.append([p, f.log_start if f else 0, f.committed_end if f else 0, f.size_bytes if f else 0,
                     f.files if f else 0])
    print_rows(["partition", "log_start_offset", "high_watermark", "size_bytes", "files"], rows)


@topics_app.command("delete")
def topics_delete(
    name: str,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask; deletes the topic's table.")] = False,
) -> None:
    """Delete a topic and its Delta table."""
    validate_name(name)
    if not yes and not typer.confirm(f"delete topic {name} and all its messages?"):
        raise fail("not deleted", 1)
    with broker_access(settings()) as broker:
        broker.delete_topic(name)
    out.print(f"deleted topic {name}", highlight=False)


# -- produce --------------------------------------------------------------------------------
@app.command()
def produce(
    topic: str,
    value: str,
    key: Annotated[str | None, typer.Option("--key", "-k")] = None,
    partition: Annotated[int | None, typer.Option(min=0)] = None,
    message_id: Annotated[str | None, typer.Option("--id", help="Message id, for deduplication.")] = None,
    json_value: Annotated[bool, typer.Option("--json", help="Parse VALUE as JSON.")] = False,
    ack: Annotated[AckMode, typer.Option(
        help="Answer when queued (none), after the WAL fsync (wal) or after the Delta commit (table).")] = AckMode.WAL,
) -> None:
    """Produce one message; prints its partition and offset."""
    validate_name(topic)
    if json_value:
        import orjson

        try:
            raw, fmt = from_json_value(orjson.loads(value))
        except orjson.JSONDecodeError as exc:
            raise fail(f"--json given but VALUE is not JSON: {exc}") from None
    else:
        raw, fmt = value.encode(), "text"
    message = NewMessage(value=raw, format=fmt, key=key, partition=partition, message_id=message_id)
    with broker_access(settings()) as broker:
        result = broker.produce(topic, message, ack)
    out.print(f"partition {result['partition']} offset {result['offset']}", highlight=False)


# -- serve ----------------------------------------------------------------------------------
@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default setting host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default setting port).")] = None,
    kafka_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="Port of the Kafka listener (default setting kafka_port, 9092).")] = None,
    auth: Annotated[AuthMode | None, typer.Option(
        help="API tokens: auto is required unless HOST is loopback (default: the auth setting).")] = None,
    workers: Annotated[int, typer.Option(
        min=1, max=64, help="Ingest processes sharing the port, each a cluster node with its own WAL "
        "(DATA_DIR, then DATA_DIR/nodes/1 ...), sharing the table root.")] = 1,
    pin_cpus: Annotated[bool, typer.Option(
        help="With --workers N at most the CPUs this process may use: each worker (its threads and the "
        "processes it starts) runs on a CPU of its own.")] = True,
    reuse_port: Annotated[bool, typer.Option(hidden=True, help="One of --workers' processes.")] = False,
    cpu: Annotated[int | None, typer.Option(hidden=True, help="The CPU this worker runs on.")] = None,
) -> None:
    """Run the ingest API and the background workers on this data dir."""
    if cpu is not None:  # first, so that every thread and child this worker starts inherits it
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            usable = ", ".join(map(str, sorted(os.sched_getaffinity(0))))
            raise typer.BadParameter(f"CPU {cpu} is not one this process may use ({usable})",
                                     param_hint="--cpu") from None
    from lakebroker.tables.process_memory import keep_small

    keep_small()

    overrides = {"host": host, "port": port, "kafka_port": kafka_port, "auth": auth}
    chosen = settings().model_copy(update={k: v for k, v in overrides.items() if v is not None})
    if workers > 1:
        from lakebroker.workers import run_workers

        raise typer.Exit(run_workers(chosen, workers, pin_cpus=pin_cpus))
    from lakebroker.server import run_server

    run_server(chosen, reuse_port=reuse_port)


@app.command()
def deliver(
    worker_id: Annotated[str | None, typer.Option(help="Stable id for this worker (default: random).")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus /metrics on this port.")] = None,
) -> None:
    """Run a delivery worker alone; several share a subscription's partitions through leases."""
    import asyncio
    import contextlib

    from lakebroker.tables.process_memory import keep_small

    keep_small()

    from prometheus_client import CollectorRegistry

    from lakebroker.delivery_worker.metrics import DeliveryMetrics
    from lakebroker.delivery_worker.worker import DeliveryWorker
    from lakebroker.tables.logs import configure_logging

    configure_logging(settings())
    import signal

    import uvloop

    registry = CollectorRegistry()
    worker = DeliveryWorker(settings(), DeliveryMetrics(registry), worker_id)
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=settings().host, registry=registry)
    err.print(f"delivery worker {worker.worker_id} on {settings().data_dir}", highlight=False)

    async def run_until_signalled() -> None:
        task = asyncio.create_task(worker.run())
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):  # stop gracefully: commit offsets, release leases
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    uvloop.run(run_until_signalled())


# -- analysts -------------------------------------------------------------------------------
@app.command()
def sql(
    query: str,
    limit: Annotated[int, typer.Option(min=1, help="Most rows printed.")] = 1000,
    output: Annotated[OutputFormat, typer.Option(
        "--format", "-f", help="table for people; csv or json (an array of objects) for scripts.")
    ] = OutputFormat.TABLE,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On failure, the whole error and the Java stack.")
                       ] = False,
) -> None:
    """Run Spark SQL; every topic is a table under its own name. The JVM's own output goes to
    DATA_DIR/_jobs/cli-sql.log, not the terminal."""
    from lakebroker.output import write_csv, write_json
    from lakebroker.spark_pipeline.sql import cli_jvm_log, run_query

    columns, rows = run_query(settings(), query, limit, verbose=verbose, jvm_log=cli_jvm_log(settings(), "sql"))
    if output is OutputFormat.CSV:
        write_csv(columns, rows, sys.stdout)
    elif output is OutputFormat.JSON:
        write_json(columns, rows, sys.stdout)
    else:
        print_rows(columns, rows)


@functools.cache  # once per process, however often main() (or a test) asks
def _register_plugins() -> None:
    """Command groups owned by other modules add themselves here."""
    from lakebroker import cluster_cli, groups_cli, jobs_cli, spark_cli, tokens_cli, wal_cli

    cluster_cli.register(app, settings, fail)
    groups_cli.register(app, settings, fail)
    jobs_cli.register(app, settings, fail)
    spark_cli.register(app, settings, fail)
    tokens_cli.register(app, settings, fail)
    wal_cli.register(app, settings, fail)


def main() -> None:
    try:
        _run()
    except SystemExit as done:
        code = done.code
    else:
        code = 0
    if isinstance(code, str):  # what sys.exit("...") prints before exiting 1
        print(code, file=sys.stderr)
    # Every command, serve and deliver included, has finished its own shutdown by now.
    exit_without_teardown(code if isinstance(code, int) else 1 if code else 0)


def _run() -> None:
    _register_plugins()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        app()
    except LakebrokerError as exc:
        err.print(f"error: {exc.message}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    except ModuleNotFoundError as exc:
        if exc.name not in SPARK_MODULES:
            raise
        err.print(f"error: {missing_spark_message('this command')}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    except Exception as exc:
        if os.environ.get("LAKEBROKER_DEBUG"):
            raise
        err.print(f"error: {type(exc).__name__}: {exc} (set LAKEBROKER_DEBUG=1 for the traceback)",
                  markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
