"""Confluent REST Proxy v3 produce against a real `serve`: records of every type, a stream answered
record by record while it is still being sent (raw chunked HTTP/1.1, and curl), each record's own
error in its own result, and the request's errors in v3's shape."""

from __future__ import annotations

import base64
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from lakebroker.ingest_api.json_objects import ObjectSplitter
from lakebroker.ingest_api.partitioner import partition_for_key
from tests.markdown_blocks import code_blocks
from tests.servers import REPO, ServerProcess, create_topic, serving, stored_messages, until

pytestmark = [pytest.mark.timeout(120)]

ME = "tests/ingest_api/test_rest_proxy_v3.py"
MAX_REQUEST_BYTES = 64 * 1024
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"LAKEBROKER_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES), "LAKEBROKER_FLUSH_INTERVAL_MS": "50"}
    with serving(tmp_path_factory.mktemp("rest-v3") / "data", env) as node:
        yield node


def _records_url(server: ServerProcess, topic: str, cluster: str = "lakebroker") -> str:
    return f"{server.url}/v3/clusters/{cluster}/topics/{topic}/records"


def _results(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    return [orjson.loads(line) for line in r.content.splitlines()]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- the split of a stream into records ------------------------------------------------------------
STREAM = (b'{"value": {"data": "a } { \\" brace"}}\n{"key": {"type": "STRING", "data": "k{"}, "value": '
          b'{"data": {"nested": [{"x": 1}, {}]}}}  {"value":{"data":"\\\\"}}')


def test_objects_split_wherever_the_bytes_are_cut() -> None:
    whole = ObjectSplitter(1 << 20).feed(STREAM)
    assert [orjson.loads(o)["value"]["data"] for o in whole] == ['a } { " brace', {"nested": [{"x": 1}, {}]}, "\\"]
    for cut in range(1, len(STREAM)):
        splitter = ObjectSplitter(1 << 20)
        parts = splitter.feed(STREAM[:cut]) + splitter.feed(STREAM[cut:])
        splitter.finish()
        assert (parts, splitter.broken) == (whole, None), cut
    one_by_one = ObjectSplitter(1 << 20)
    assert [o for i in range(len(STREAM)) for o in one_by_one.feed(STREAM[i:i + 1])] == whole


@pytest.mark.parametrize(("stream", "split", "why"), [
    (b'{"a": 1} [2] {"b": 3}', 1, "only whitespace, found '[2]'"),
    (b'{"a": 1} "text" {"b": 3}', 1, "a record is a JSON object, found '\"text\"'"),
    (b'{"a": 1}}', 1, "a record is a JSON object, found '}'"),
    (b'{"a": 1} {"b": "unclosed', 1, "ends inside a record"),
    (b'{"a": 1} 7', 1, "found '7'"),
    (b'{"a": "' + b"x" * 200, 0, "over 100 bytes"),
    (b" \n ", 0, "holds no record"),
    (b"", 0, "holds no record"),
])
def test_a_broken_stream_keeps_the_records_before_the_break(stream: bytes, split: int, why: str) -> None:
    splitter = ObjectSplitter(100)
    done = splitter.feed(stream)
    splitter.finish()
    assert len(done) == split
    assert splitter.broken is not None and why in splitter.broken
    assert splitter.feed(b'{"later": 1}') == []  # nothing after a break


# -- produce ---------------------------------------------------------------------------------------
def test_records_of_every_type_are_stored_as_sent(server: ServerProcess) -> None:
    topic = create_topic(server, "v3-types", 4)
    records = [
        {"key": {"type": "STRING", "data": "user-1"}, "value": {"type": "JSON", "data": {"amount": 42}},
         "headers": [{"name": "source", "value": _b64(b"checkout")}]},
        {"key": {"type": "BINARY", "data": _b64(b"user-2")}, "value": {"type": "BINARY", "data": _b64(b"\x00\xff")}},
        {"value": {"type": "STRING", "data": "plain text"}, "partition_id": 3,
         "timestamp": "2026-01-02T03:04:05Z"},
        {"key": {"data": 17}, "value": {"data": None}},  # JSON by default; a null value is a tombstone
    ]
    r = httpx.post(_records_url(server, topic), content=b"".join(orjson.dumps(rec) for rec in records),
                   headers=JSON, timeout=30)
    results = _results(r)
    assert [res["error_code"] for res in results] == [200] * 4, results
    assert [res["partition_id"] for res in results] == [
        partition_for_key("user-1", 4), partition_for_key("user-2", 4), 3, partition_for_key("17", 4)]
    assert results[0]["key"] == {"type": "STRING", "size": 6} and results[0]["value"] == {"type": "JSON", "size": 13}
    assert results[1]["value"] == {"type": "BINARY", "size": 2}
    assert all(res["cluster_id"] == "lakebroker" and res["topic_name"] == topic for res in results)
    assert all(res["timestamp"].endswith("Z") for res in results)

    def stored(res: dict[str, Any]) -> dict[str, Any]:
        return {m["offset"]: m for m in stored_messages(server, topic, res["partition_id"])}[res["offset"]]

    until(lambda: all(res["offset"] in {m["offset"] for m in stored_messages(server, topic, res["partition_id"])}
                      for res in results), "every record in the table", timeout=30)
    first, second, third, fourth = (stored(res) for res in results)
    assert (first["key"], first["value"], first["headers"]) == ("user-1", {"amount": 42}, {"source": "checkout"})
    assert (second["key"], second["value_b64"]) == ("user-2", _b64(b"\x00\xff"))
    assert (third["key"], third["value"], third["format"]) == (None, "plain text", "text")
    assert (fourth["key"], fourth["value"]) == ("17", None)


class ChunkedUpload:
    """A produce request sent chunk by chunk over a raw socket, its answer read chunk by chunk."""

    def __init__(self, server: ServerProcess, topic: str) -> None:
        host, port = server.url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.sendall(f"POST /v3/clusters/lakebroker/topics/{topic}/records HTTP/1.1\r\nHost: {host}\r\n"
                          "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        self.reader = self.sock.makefile("rb")

    def __enter__(self) -> ChunkedUpload:
        return self

    def __exit__(self, *_: object) -> None:
        self.reader.close()
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    def answer_head(self) -> bytes:
        status = self.reader.readline()
        while self.reader.readline() != b"\r\n":  # its headers
            pass
        return status

    def results(self) -> list[dict[str, Any]]:
        """The answer's next chunk, as results (empty: the answer has ended)."""
        size = int(self.reader.readline(), 16)
        chunk = self.reader.read(size + 2)
        return [orjson.loads(line) for line in chunk.splitlines() if line]


def test_a_stream_is_answered_record_by_record_while_it_is_sent(server: ServerProcess) -> None:
    """Each record's result comes back before the next record is sent, and a record split across
    chunks (inside a string) is read whole."""
    topic = create_topic(server, "v3-stream", 1)
    with ChunkedUpload(server, topic) as upload:
        assert upload.answer_head().startswith(b"HTTP/1.1 200")
        for i in range(3):
            record = orjson.dumps({"value": {"type": "STRING", "data": f"record {i}"}})
            upload.send(record[:15])  # cut inside the value's string
            upload.send(record[15:])
            assert [(res["error_code"], res["offset"]) for res in upload.results()] == [(200, i)]
        upload.send(b"")  # the last chunk: the answer ends with the request
        assert upload.results() == []
    until(lambda: len(stored_messages(server, topic, 0)) == 3, "three records stored", timeout=30)
    assert [m["value"] for m in stored_messages(server, topic, 0)] == ["record 0", "record 1", "record 2"]


def test_the_guide_s_curl_streams_records_and_reads_a_result_for_each(server: ServerProcess) -> None:
    """docs/producing.md's streamed example, as written there, with curl."""
    [block] = [b for b in code_blocks(REPO / "docs" / "producing.md") if b.tested_by == ME]
    create_topic(server, "orders", 3)
    script = block.text.replace("localhost:8080", server.url.removeprefix("http://"))
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", script], capture_output=True, timeout=60, check=True)
    results = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [res["error_code"] for res in results] == [200, 200], results
    assert results[0]["partition_id"] == partition_for_key("k1", 3)
    assert [res["value"]["type"] for res in results] == ["JSON", "JSON"]


def test_each_record_gets_its_own_error_and_the_others_are_written(server: ServerProcess) -> None:
    topic = create_topic(server, "v3-errors", 2)
    sent = [
        orjson.dumps({"value": {"data": "good 1"}}),
        orjson.dumps({"value": {"type": "BINARY", "data": "not base64!"}}),
        orjson.dumps({"value": {"type": "AVRO", "data": {"a": 1}}}),
        orjson.dumps({"value": {"data": "v"}, "headers": [{"name": "h", "value": _b64(b"1")},
                                                          {"name": "h", "value": _b64(b"2")}]}),
        orjson.dumps({"value": {"data": "v"}, "headers": [{"name": "h", "value": _b64(b"\xff")}]}),
        b'{"value": {"data": tru}}',  # malformed JSON: this record only
        orjson.dumps({"value": {"data": "v"}, "partition_id": 2}),
        orjson.dumps({"value": {"data": "v"}, "offset": 3}),
        orjson.dumps({"value": {"data": "good 2"}}),
    ]
    results = _results(httpx.post(_records_url(server, topic), content=b"\n".join(sent), headers=JSON, timeout=30))
    assert [res["error_code"] for res in results] == [200, 400, 400, 400, 400, 400, 400, 400, 200]
    messages = [res.get("message", "") for res in results]
    assert "not valid base64" in messages[1]
    assert "need a schema registry" in messages[2]
    assert "'h' is sent twice" in messages[3]
    assert "UTF-8" in messages[4]
    assert "malformed JSON in a record" in messages[5]
    assert "partition 2 does not exist" in messages[6]
    assert "unknown record field(s) offset" in messages[7]
    until(lambda: sum(len(stored_messages(server, topic, p)) for p in range(2)) == 2, "the two good records",
          timeout=30)


def test_a_stream_that_breaks_keeps_what_came_before(server: ServerProcess) -> None:
    topic = create_topic(server, "v3-break", 1)
    body = orjson.dumps({"value": {"data": "kept"}}) + b" [not a record] " + orjson.dumps({"value": {"data": "x"}})
    results = _results(httpx.post(_records_url(server, topic), content=body, headers=JSON, timeout=30))
    assert [res["error_code"] for res in results] == [200, 400]
    assert "only whitespace" in results[1]["message"]
    until(lambda: [m["value"] for m in stored_messages(server, topic, 0)] == ["kept"], "the record before the break",
          timeout=30)


def test_a_stream_over_max_request_bytes_ends_with_a_413_result(server: ServerProcess) -> None:
    topic = create_topic(server, "v3-long", 1)
    record = orjson.dumps({"value": {"data": "x" * 1000}})
    written = 0
    with ChunkedUpload(server, topic) as upload:
        assert upload.answer_head().startswith(b"HTTP/1.1 200")
        while (written + 1) * len(record) <= MAX_REQUEST_BYTES:
            upload.send(record)
            assert [res["error_code"] for res in upload.results()] == [200]
            written += 1
        upload.send(record)  # past the bound: the stream ends with the refusal
        [refused] = upload.results()
        assert refused["error_code"] == 413 and "max_request_bytes" in refused["message"], refused
        assert upload.results() == []
    until(lambda: len(stored_messages(server, topic, 0)) == written, "every record answered 200", timeout=30)


@pytest.mark.parametrize(("path", "headers", "status", "text"), [
    ("/v3/clusters/other/topics/v3-types/records", JSON, 404, "cluster 'other' does not exist"),
    ("/v3/clusters/lakebroker/topics/missing/records", JSON, 404, "'missing' does not exist"),
    ("/v3/clusters/lakebroker/topics/v3-types/records", {"content-type": "text/plain"}, 415,
     "content type 'text/plain' is not supported"),
])
def test_the_request_s_own_errors_in_v3_s_shape(server: ServerProcess, path: str, headers: dict[str, str],
                                                status: int, text: str) -> None:
    r = httpx.post(f"{server.url}{path}", content=b'{"value": {"data": 1}}', headers=headers, timeout=30)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["error_code"] == status and text in body["message"], body


def test_the_cluster_is_listed(server: ServerProcess) -> None:
    listed = httpx.get(f"{server.url}/v3/clusters", timeout=30).json()
    assert [c["cluster_id"] for c in listed["data"]] == ["lakebroker"]
    assert httpx.get(f"{server.url}/v3/clusters/lakebroker", timeout=30).json()["cluster_id"] == "lakebroker"
    missing = httpx.get(f"{server.url}/v3/clusters/nope", timeout=30)
    assert (missing.status_code, missing.json()["error_code"]) == (404, 404)
