"""`lakebroker.spark.read_topic` on real local Spark against a topic a real broker wrote: decoded
values beside their bytes, and every kind of position, starting and ending."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lakebroker.ingest_api.app import create_app
from lakebroker.spark import TableVersion, read_topic
from lakebroker.tables import delta
from lakebroker.tables.errors import NotFound
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, dict[str, Any]]]:
    """Topic `t` (2 partitions): a first batch, then a second one; their results and the table version
    between them."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("reads") / "data", flush_interval_ms=20)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/topics", json={"name": "t", "partitions": 2}).status_code == 201
        first = [{"partition": 0, "value": {"n": 1}}, {"partition": 0, "value": "plain text", "key": "k"},
                 {"partition": 1, "value_b64": base64.b64encode(b"\x00\xffraw").decode(), "headers": {"h": "v"}},
                 {"partition": 1, "key": "gone", "value": None}]
        a = client.post("/v1/topics/t/batch?ack=table", json={"messages": first}).json()["results"]
        between = delta.load(Layout.of(settings).topic_table("t")).version()
        second = [{"partition": p, "value": f"second {i}"} for i, p in enumerate((0, 1, 0))]
        b = client.post("/v1/topics/t/batch?ack=table", json={"messages": second}).json()["results"]
    yield settings, {"first": a, "second": b, "between": between}


def _read(spark: Any, settings: Settings, **positions: Any) -> list[tuple[Any, ...]]:
    df = read_topic(spark, "t", settings=settings, **positions)
    return sorted((r["partition"], r["offset"], r["value"]) for r in df.collect())


def test_rows_come_decoded_beside_their_bytes(spark: Any, written: tuple[Settings, dict[str, Any]]) -> None:
    settings, _ = written
    df = read_topic(spark, "t", settings=settings)
    assert df.columns == ["partition", "offset", "timestamp", "key", "value", "value_bytes", "format", "headers"]
    rows = {(r["partition"], r["offset"]): r for r in df.collect()}
    assert len(rows) == 7
    assert (rows[(0, 0)]["value"], rows[(0, 0)]["format"]) == ('{"n":1}', "json")
    assert (rows[(0, 1)]["value"], rows[(0, 1)]["key"], rows[(0, 1)]["value_bytes"]) == ("plain text", "k",
                                                                                          bytearray(b"plain text"))
    raw = rows[(1, 0)]
    assert (raw["value"], bytes(raw["value_bytes"]), raw["format"], raw["headers"]) == (None, b"\x00\xffraw",
                                                                                       "binary", {"h": "v"})
    assert (rows[(1, 1)]["value"], rows[(1, 1)]["value_bytes"]) == (None, None), "a tombstone"
    assert isinstance(rows[(0, 0)]["timestamp"], datetime)


def test_positions_bound_the_read(spark: Any, written: tuple[Settings, dict[str, Any]]) -> None:
    settings, w = written
    everything = _read(spark, settings)
    second = sorted((r["partition"], r["offset"]) for r in w["second"])
    first = sorted((r["partition"], r["offset"]) for r in w["first"])

    def keys(rows: list[tuple[Any, ...]]) -> list[tuple[int, int]]:
        return [(p, o) for p, o, _ in rows]

    assert keys(everything) == sorted(first + second)
    assert _read(spark, settings, starting="earliest", ending="latest") == everything
    assert _read(spark, settings, starting="latest") == [] and _read(spark, settings, ending="earliest") == []
    # a table version: where the committed ends stood then
    assert keys(_read(spark, settings, starting=TableVersion(w["between"]))) == second
    assert keys(_read(spark, settings, ending=TableVersion(w["between"]))) == first
    # per partition, inclusive start and exclusive end; a partition left out is not bounded
    assert keys(_read(spark, settings, starting={0: 2})) == [(p, o) for p, o, _ in everything if p == 1 or o >= 2]
    assert keys(_read(spark, settings, ending={1: 1, 0: 3})) == [(p, o) for p, o, _ in everything
                                                                if o < (3 if p == 0 else 1)]
    # a timestamp: the log-append time, as the first message of the second batch got it
    since = datetime.fromisoformat(w["second"][0]["timestamp"])
    assert keys(_read(spark, settings, starting=since)) == second
    assert keys(_read(spark, settings, ending=since)) == first
    assert _read(spark, settings, starting=since + timedelta(days=1)) == []


@pytest.mark.parametrize(("positions", "error"), [
    ({"starting": datetime(2026, 1, 1)}, "no time zone"),
    ({"starting": {2: 0}}, "partitions 0 to 1, not 2"),
    ({"ending": {0: -1}}, "non-negative int"),
    ({"ending": TableVersion(10_000)}, "table versions 0 to"),
    ({"starting": "newest"}, "a position is"),
])
def test_a_position_that_is_not_one_is_refused(spark: Any, written: tuple[Settings, dict[str, Any]],
                                               positions: dict[str, Any], error: str) -> None:
    settings, _ = written
    with pytest.raises(ValueError, match=error):
        read_topic(spark, "t", settings=settings, **positions)


def test_an_unknown_topic_is_refused(spark: Any, written: tuple[Settings, dict[str, Any]]) -> None:
    with pytest.raises(NotFound, match="nope"):
        read_topic(spark, "nope", settings=written[0])


def test_a_timestamp_in_another_zone_is_the_same_instant(spark: Any, written: tuple[Settings, dict[str, Any]]) -> None:
    settings, w = written
    since = datetime.fromisoformat(w["second"][0]["timestamp"]).astimezone(UTC)
    elsewhere = since.astimezone(timezone(timedelta(hours=-7)))
    assert _read(spark, settings, starting=elsewhere) == _read(spark, settings, starting=since) != []
