"""A real Apache Kafka broker (KRaft, one node) and Kafka's own perf tools, from Maven Central's jars
(scripts/kafka_tools.sh fetches them into .cache/kafka/jars): the reference the Kafka benchmark
measures lakebroker's listener against, with the same tools, on the same host, in the same run."""

from __future__ import annotations

import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.harness.servers import BenchError, free_port
from bench.result import REPO

LOG4J = REPO / "scripts" / "kafka" / "log4j2.yaml"
BROKER_HEAP = "-Xmx1g"
TOOL_HEAP = "-Xmx512m"


def classpath() -> str:
    """Kafka's jars, fetched first if missing (once)."""
    subprocess.run(["bash", str(REPO / "scripts" / "kafka_tools.sh"), "build"], check=True, timeout=600)
    return str(REPO / ".cache" / "kafka" / "jars" / "*")


def java(main: str, *args: str, heap: str = TOOL_HEAP) -> list[str]:
    return ["java", heap, f"-Dlog4j2.configurationFile={LOG4J}", "-cp", classpath(), main, *args]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def kafka_broker(work: Path, timeout_s: float = 90) -> Iterator[str]:
    """A single-node Kafka (broker and controller in one process, KRaft) on loopback at its defaults
    but for topics made with 3 partitions; yields its bootstrap address."""
    port, controller = free_port(), free_port()
    logs = work / "kafka-logs"
    props = work / "kafka-server.properties"
    props.write_text("\n".join([
        "process.roles=broker,controller", "node.id=1",
        f"controller.quorum.bootstrap.servers=127.0.0.1:{controller}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}", "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT", f"log.dirs={logs}",
        "num.partitions=3", "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1", "share.coordinator.state.topic.replication.factor=1",
        "group.initial.rebalance.delay.ms=0", ""]))
    subprocess.run(java("kafka.tools.StorageTool", "format", "-t", str(uuid.uuid4()), "-c", str(props),
                        "--standalone"), check=True, capture_output=True, timeout=120)
    log = (work / "kafka-broker.log").open("ab")
    proc = subprocess.Popen(java("kafka.Kafka", str(props), heap=BROKER_HEAP), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not _accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"Kafka did not start: {(work / 'kafka-broker.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def create_kafka_topic(bootstrap: str, name: str, partitions: int = 3) -> None:
    subprocess.run(java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap, "--create",
                        "--topic", name, "--partitions", str(partitions), "--replication-factor", "1"),
                   check=True, capture_output=True, timeout=120)


@dataclass(frozen=True)
class Produced:
    records_s: float
    mb_s: float
    avg_ms: float
    p50_ms: float
    p99_ms: float


_PRODUCED = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                       r"[\d.]+ ms max latency, (\d+) ms 50th, \d+ ms 95th, (\d+) ms 99th")


def producer_perf(bootstrap: str, topic: str, records: int, acks: str, record_size: int = 100,
                  timeout_s: float = 300) -> Produced:
    """Kafka's ProducerPerformance at full speed (`--throughput -1`) with the producer's defaults
    (idempotence on with acks=all, batch.size 16 KiB, linger.ms 5) but `acks`."""
    out = subprocess.run(java("org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records",
                              str(records), "--record-size", str(record_size), "--throughput", "-1",
                              "--producer-props", f"bootstrap.servers={bootstrap}", f"acks={acks}"),
                         capture_output=True, text=True, timeout=timeout_s)
    found = _PRODUCED.findall(out.stdout)
    if out.returncode != 0 or not found or int(found[-1][0]) != records:
        raise BenchError(f"ProducerPerformance against {bootstrap} failed ({out.returncode}): "
                         f"{(out.stdout + out.stderr)[-2000:]}")
    _, rate, mb, avg, p50, p99 = found[-1]
    return Produced(float(rate), float(mb), float(avg), float(p50), float(p99))


@dataclass(frozen=True)
class Consumed:
    records_s: float  # over the whole run, the group's join included
    mb_s: float
    rebalance_ms: float
    fetch_records_s: float  # after the join


def consumer_perf(bootstrap: str, topic: str, records: int, timeout_s: float = 300) -> Consumed:
    """Kafka's ConsumerPerformance: one consumer of a new group reads `records` from the start."""
    out = subprocess.run(java("org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", bootstrap,
                              "--topic", topic, "--messages", str(records), "--timeout", "60000",
                              "--group", f"perf-{uuid.uuid4().hex[:8]}"),
                         capture_output=True, text=True, timeout=timeout_s)
    rows = [line.split(",") for line in out.stdout.splitlines() if line.count(",") >= 9 and line[:1].isdigit()]
    if out.returncode != 0 or not rows:
        raise BenchError(f"ConsumerPerformance against {bootstrap} failed ({out.returncode}): "
                         f"{(out.stdout + out.stderr)[-2000:]}")
    row = [c.strip() for c in rows[-1]]
    if int(row[4]) < records:
        raise BenchError(f"ConsumerPerformance read {row[4]} of {records} records from {bootstrap}")
    return Consumed(float(row[5]), float(row[3]), float(row[6]), float(row[9]))
