"""A raw Kafka connection for tests that need a request no client would send (a damaged batch, a
retry after a restart, a bad version): requests built and responses read with kio, Kafka's own
schemas. Functional tests use real clients (confluent-kafka, kafka-python) instead."""

from __future__ import annotations

import datetime
import io
import socket
import struct
from typing import Any

from kio.index import load_response_schema
from kio.records.schema import NewRecordBatch, Record, RecordHeader
from kio.records.writers import write_batch
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i64

_SIZE = struct.Struct(">i")


class KafkaConnection:
    def __init__(self, address: str, timeout: float = 30) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def send(self, request: Any) -> None:
        self.correlation += 1
        header_schema = request.__header_schema__
        fields = {"request_api_key": request.__api_key__, "request_api_version": request.__version__,
                  "correlation_id": i32(self.correlation), "client_id": "lakebroker-tests"}
        out = io.BytesIO()
        entity_writer(header_schema)(out, header_schema(**fields))
        entity_writer(type(request))(out, request)
        self.send_raw(out.getvalue())

    def send_raw(self, frame: bytes) -> None:
        self.sock.sendall(_SIZE.pack(len(frame)) + frame)

    def receive(self, api_key: int, version: int, correlation: int | None = None) -> Any:
        """The next response, read as `api_key` v`version`'s, to the request sent last (or the one
        `correlation` numbers, of several sent ahead: answers come in request order)."""
        (size,) = _SIZE.unpack(self._exactly(4))
        frame = self._exactly(size)
        schema = load_response_schema(api_key, version)
        header, used = entity_reader(schema.__header_schema__)(frame, 0)
        expected = self.correlation if correlation is None else correlation
        assert header.correlation_id == expected, (header, expected)
        body, _ = entity_reader(schema)(frame, used)
        return body

    def call(self, request: Any) -> Any:
        self.send(request)
        return self.receive(request.__api_key__, request.__version__)

    def closed_by_peer(self) -> bool:
        """Whether the broker closed the connection (the next read sees its end)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            piece = self.sock.recv(n - len(data))
            if not piece:
                raise ConnectionError("the broker closed the connection")
            data += piece
        return data


def record_batch(values: list[bytes], *, key: bytes | None = None, producer_id: int = -1, base_sequence: int = -1,
                 headers: tuple[tuple[bytes, bytes | None], ...] = ()) -> bytes:
    """An uncompressed magic-v2 batch of `values`."""
    now = datetime.datetime.now(datetime.UTC)
    records = tuple(Record(attributes=i8(0), timestamp=now, offset=i64(i), key=key, value=v,
                           headers=tuple(RecordHeader(key=k, value=hv) for k, hv in headers))
                    for i, v in enumerate(values))
    out = io.BytesIO()
    write_batch(out, NewRecordBatch(producer_id=i64(producer_id), producer_epoch=i16(0 if producer_id >= 0 else -1),
                                    base_sequence=i32(base_sequence), records=records, attributes=i16(0)))
    return out.getvalue()


def produce(topic: str, partition: int, records: bytes, acks: int = -1) -> ProduceRequest:
    return ProduceRequest(acks=i16(acks), timeout=datetime.timedelta(seconds=30), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=i32(partition), records=records),)),))


def fetch(topic: str, partition: int, offset: int, max_wait_s: float) -> FetchRequest:
    return FetchRequest(max_wait=datetime.timedelta(seconds=max_wait_s), min_bytes=i32(1), topics=(FetchTopic(
        topic=topic, partitions=(FetchPartition(partition=i32(partition), fetch_offset=i64(offset),
                                                partition_max_bytes=i32(1 << 20)),)),), forgotten_topics_data=())


def partition_answer(response: Any) -> Any:
    """The one partition's answer in a Produce response."""
    (topic,) = response.responses
    (partition,) = topic.partition_responses
    return partition
