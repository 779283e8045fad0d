"""`Producer.send_arrow` against a real `lakebroker serve`: Arrow tables, pandas and Polars frames
stored as their rows, a lost answer retried without a second copy, and refusals that name the
column."""

from __future__ import annotations

from typing import Any

import httpx
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from lakebroker_client import Producer, RequestRefused, Retry
from tests.client.conftest import Broker
from tests.client.test_producer_e2e import read_messages


class LosesFirstArrowAnswer(httpx.HTTPTransport):
    """Forwards to the broker, then drops the first /batch answer: the rows were stored, the
    client never heard back."""

    def __init__(self) -> None:
        super().__init__()
        self.lost: pa.Table | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if self.lost is None and request.url.path.endswith("/batch"):
            response.read()
            self.lost = pa.ipc.open_stream(response.content).read_all()
            response.close()
            raise httpx.ReadError("connection reset after the broker answered")
        return response


def _dense(results: pa.Table) -> bool:
    by_partition: dict[int, list[int]] = {}
    for row in results.to_pylist():
        by_partition.setdefault(row["partition"], []).append(row["offset"])
    return all(sorted(o) == list(range(len(o))) for o in by_partition.values())


def test_an_arrow_table_is_stored_row_for_row_in_requests_of_max_rows(broker: Broker) -> None:
    topic = broker.create_topic("arrow-table", partitions=3)
    n = 12_000
    table = pa.table({
        "value": pa.array([f"v{i}".encode() for i in range(n)], pa.binary()),
        "key": pa.array([f"user-{i % 50}" for i in range(n)]),
        "headers": pa.array([[("row", str(i))] if i % 1000 == 0 else None for i in range(n)],
                            pa.map_(pa.string(), pa.string())),
    })
    with Producer(broker.url, broker.token) as p:
        results = p.send_arrow(topic, table, max_rows=5000)
        assert p.stats().requests == 3 and p.stats().messages == n
    assert results.num_rows == n and results.schema.names == ["partition", "offset", "duplicate", "timestamp"]
    assert not any(results.column("duplicate").to_pylist()) and _dense(results)
    stored = {(m.partition, m.offset): m for m in read_messages(broker.url, topic, broker.token, n)}
    assert len(stored) == n
    for i in (0, 1, 4999, 5000, 11_999):  # the rows at the requests' edges, where they were placed
        row = results.slice(i, 1).to_pylist()[0]
        m = stored[(row["partition"], row["offset"])]
        assert (m.value, m.key) == (f"v{i}".encode(), f"user-{i % 50}")
    assert stored[(results["partition"][0].as_py(), 0)].headers == {"row": "0"}


def test_a_table_of_many_small_pieces_is_sent_as_batches_the_broker_takes(broker: Broker) -> None:
    """A table concatenated from many small ones holds a record batch per piece; the broker takes at
    most 1,024 a body, so the client joins them first."""
    topic = broker.create_topic("arrow-pieces", partitions=1)
    table = pa.concat_tables([pa.table({"value": pa.array([f"v{i}".encode()], pa.binary())}) for i in range(2000)])
    assert len(table.to_batches()) == 2000
    with Producer(broker.url, broker.token) as p:
        results = p.send_arrow(topic, table)
    assert results.column("offset").to_pylist() == list(range(2000))


def test_pandas_and_polars_frames_go_through_it(broker: Broker) -> None:
    topic = broker.create_topic("arrow-frames", partitions=2)
    frame = pd.DataFrame({"payload": [f"p{i}" for i in range(100)], "customer": [f"c{i % 7}" for i in range(100)]})
    polars = pl.DataFrame({"value": [f"q{i}" for i in range(50)], "partition": [i % 2 for i in range(50)]})
    with Producer(broker.url, broker.token) as p:
        from_pandas = p.send_arrow(topic, frame, columns={"value": "payload", "key": "customer"}, ack="table")
        from_polars = p.send_arrow(topic, polars)
    assert from_pandas.num_rows == 100 and from_polars.num_rows == 50
    assert from_polars.column("partition").to_pylist() == [i % 2 for i in range(50)], "its partition column"
    values = {m.value for m in read_messages(broker.url, topic, broker.token, 150)}
    assert values == {f"p{i}" for i in range(100)} | {f"q{i}" for i in range(50)}, "strings stored as text"


def test_a_lost_answer_is_retried_without_a_second_copy(broker: Broker) -> None:
    topic = broker.create_topic("arrow-lost", partitions=3)
    transport = LosesFirstArrowAnswer()
    table = pa.table({"value": pa.array([f"m{i}" for i in range(500)])})
    with Producer(broker.url, broker.token, transport=transport, retry=Retry(initial_backoff_s=0.01)) as p:
        results = p.send_arrow(topic, table)
        assert p.stats().retries == 1
    assert transport.lost is not None and not any(transport.lost.column("duplicate").to_pylist())
    assert all(results.column("duplicate").to_pylist()), "the retry was answered from the dedup index"
    assert results.select(["partition", "offset"]) == transport.lost.select(["partition", "offset"])
    assert len(read_messages(broker.url, topic, broker.token, 500)) == 500


@pytest.mark.parametrize(("name", "data", "error"), [
    ("int", pa.table({"value": pa.array([1, 2, 3])}), "value column must be binary or string, not int64"),
    ("colour", pa.table({"value": pa.array(["a"]), "colour": pa.array(["red"])}), "unknown columns colour"),
])
def test_a_refused_table_names_its_column(broker: Broker, name: str, data: pa.Table, error: str) -> None:
    topic = broker.create_topic(f"arrow-refused-{name}", partitions=1)
    with Producer(broker.url, broker.token) as p, pytest.raises(RequestRefused, match=error) as refused:
        p.send_arrow(topic, data)
    assert refused.value.status == 422


@pytest.mark.parametrize(("data", "kwargs", "error"), [
    ({"value": [1]}, {}, "takes a pyarrow Table"),
    (pa.table({"payload": ["a"]}), {}, "no value column"),
    (pa.table({"payload": ["a"]}), {"columns": {"body": "payload"}}, "maps wire names"),
    (pa.table({"payload": ["a"]}), {"columns": {"value": "nope"}}, "no column nope"),
])
def test_what_cannot_be_sent_is_refused_before_any_request(data: Any, kwargs: dict[str, Any], error: str) -> None:
    with Producer("http://127.0.0.1:9", routing=False) as p, pytest.raises((TypeError, ValueError), match=error):
        p.send_arrow("t", data, **kwargs)
