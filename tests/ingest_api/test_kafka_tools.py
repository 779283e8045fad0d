"""Apache Kafka's own command-line tools (the jars `make setup` fetches from Maven Central) and kcat
(Debian's package, over librdkafka) against the Kafka listener: kafka-topics creates, grows,
describes and deletes a topic; kafka-console-producer and kcat produce keyed records;
kafka-console-consumer and kcat read them back; kafka-consumer-groups describes the group's
committed offsets and lag. What each tool did is checked against the broker's HTTP API."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from bench.harness.kafka import java
from tests.servers import ServerProcess, described_topic, serving, stored_messages, until

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("kafka-tools") / "data", {"LAKEBROKER_FLUSH_INTERVAL_MS": "50"}) as node:
        yield node


def _tool(main: str, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
    done = subprocess.run(java(main, *args), input=stdin, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{main} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


def test_kafka_topics_creates_grows_describes_and_deletes(server: ServerProcess) -> None:
    tc = "org.apache.kafka.tools.TopicCommand"
    _tool(tc, "--bootstrap-server", server.kafka, "--create", "--topic", "by-tool", "--partitions", "2",
          "--config", "retention.ms=120000")
    shown = described_topic(server, "by-tool")
    assert shown is not None and (shown["partitions"], shown["retention_ms"]) == (2, 120_000)
    _tool(tc, "--bootstrap-server", server.kafka, "--alter", "--topic", "by-tool", "--partitions", "4")
    described = _tool(tc, "--bootstrap-server", server.kafka, "--describe", "--topic", "by-tool")
    assert "PartitionCount: 4" in described and "retention.ms=120000" in described, described
    _tool(tc, "--bootstrap-server", server.kafka, "--delete", "--topic", "by-tool")
    until(lambda: described_topic(server, "by-tool") is None, "the topic deleted", timeout=30)


def test_console_producer_and_kcat_write_console_consumer_and_kcat_read(server: ServerProcess) -> None:
    r = httpx.post(f"{server.url}/v1/topics", json={"name": "console", "partitions": 1}, timeout=30)
    assert r.status_code == 201, r.text
    _tool("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", server.kafka, "--topic", "console",
          "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
          stdin="k1:from java 1\nk2:from java 2\n")
    subprocess.run(["kcat", "-P", "-b", server.kafka, "-t", "console", "-p", "0", "-K", ":"],
                   input="k3:from kcat\n", text=True, check=True, timeout=60)
    until(lambda: len(stored_messages(server, "console", 0)) == 3, "three records in the table", timeout=30)
    stored = [(m["key"], base64.b64decode(str(m["value_b64"])).decode()) for m in stored_messages(server, "console", 0)]
    assert stored == [("k1", "from java 1"), ("k2", "from java 2"), ("k3", "from kcat")]

    consumed = _tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", server.kafka,
                     "--topic", "console", "--from-beginning", "--max-messages", "3", "--group", "console-group",
                     "--formatter-property", "print.key=true", "--formatter-property", "key.separator=:",
                     "--timeout-ms", "60000")
    assert consumed.splitlines() == ["k1:from java 1", "k2:from java 2", "k3:from kcat"]
    read = subprocess.run(["kcat", "-C", "-b", server.kafka, "-t", "console", "-o", "beginning", "-e", "-f",
                           "%k=%s@%o\\n"], capture_output=True, text=True, check=True, timeout=60).stdout
    assert read.splitlines() == ["k1=from java 1@0", "k2=from java 2@1", "k3=from kcat@2"]

    groups = _tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--bootstrap-server",
                   server.kafka, "--describe", "--group", "console-group")
    row = next((line.split() for line in groups.splitlines() if line.startswith("console-group")), groups)
    assert row[1:6] == ["console", "0", "3", "3", "0"], groups  # topic, partition, offset, log end, lag
