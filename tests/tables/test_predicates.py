"""Replay predicates (tables/predicates.py): what `check` lets through and why it refuses the rest,
and what `Query.matching` finds in a real topic table against the same rows judged in Python."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from lakebroker.tables.predicates import InvalidPredicate, Query, check
from lakebroker.tables.schemas import TOPIC_SCHEMA
from tests.markdown_blocks import code_blocks

T0 = datetime(2026, 12, 1, tzinfo=UTC)
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("predicate", [
    "key = 'eu-1'",
    "key LIKE 'eu-%' AND headers['region'] = 'eu' AND (value->>'amount')::DOUBLE > 100",
    "value.amount::INT BETWEEN 10 AND 20 OR value_text ILIKE '%refund%'",
    "\"offset\" >= 5 AND partition IN (0, 2) AND timestamp > now() - INTERVAL 1 HOUR",
    "NOT (key IS NULL) AND starts_with(key, 'eu') AND json_extract_string(value, '$.customer.id') = 'c-7'",
    "CASE WHEN format = 'json' THEN TRY_CAST(value->>'n' AS INT) % 2 = 0 ELSE false END",
    "key = 'a' -- a trailing comment",
    "(key = 'a') OR (key = 'b')",
])
def test_read_only_expressions_over_the_columns_pass(predicate: str) -> None:
    assert check(predicate).text == predicate.strip()


@pytest.mark.parametrize(("predicate", "reason"), [
    ("", "the predicate is empty"),
    ("key = 'a'; DROP TABLE messages", "syntax error"),
    ("key = 'a' UNION SELECT 1", "syntax error"),
    ("key IN (SELECT key FROM messages)", "subqueries are not allowed"),
    ("EXISTS (SELECT 1)", "subqueries are not allowed"),
    ("x = (SELECT 1)", "no column 'x'"),
    ("customer = 'c-7'", "no column 'customer'"),
    ("read_text('/etc/passwd') <> ''", "the function 'read_text' is not allowed"),
    ("getenv('HOME') = '/root'", "the function 'getenv' is not allowed"),
    ("current_setting('threads') = '1'", "the function 'current_setting' is not allowed"),
    ("count(*) > 1", "the function 'count_star' is not allowed"),
    ("main.lower(key) = 'a'", "the function 'lower' is not allowed"),
    ("key = ?", "parameter expressions are not allowed"),
    ("key = 'a", "unterminated string literal"),
    ("k" * 4097, "at most 4,096"),
    ("true) USING SAMPLE (10", "not one expression"),
    ("true) ORDER BY key LIMIT (1", "not one expression"),
    ("NOT " * 100 + "true", "nested more than 64 deep"),
    ("length(replace(replace(value_text, 'a', value_text), 'a', value_text)) > 0", "'replace' is not allowed"),
    ("value->'customer' IS NOT NULL", "lambda expressions are not allowed"),
])
def test_anything_else_is_refused_with_the_reason(predicate: str, reason: str) -> None:
    with pytest.raises(InvalidPredicate, match=reason) as refused:
        check(predicate)
    assert refused.value.status == 422 and refused.value.code == "invalid_predicate"


def _rows() -> list[dict[str, Any]]:
    rows = []
    for i in range(90):
        fmt = ("json", "text", "binary")[i % 3] if i % 10 else "json"
        doc = {"n": i, "amount": (i % 7) * 30, "customer": {"id": f"c-{i % 5}"}}
        value = {"json": orjson.dumps(doc), "text": f"refund {i}".encode(), "binary": b"\xff\x00" + bytes([i])}[fmt]
        rows.append({"partition": i % 3, "offset": i // 3, "timestamp": T0 + timedelta(seconds=i),
                     "key": None if i % 11 == 0 else f"{'eu' if i % 2 else 'us'}-{i}", "value": value, "format": fmt,
                     "headers": [("region", "eu" if i % 4 else "us")], "message_id": None, "producer_id": None,
                     "sequence": None, "_doc": doc if fmt == "json" else None})
    return rows


def _header(row: dict[str, Any], name: str) -> str | None:
    return dict(row["headers"]).get(name)


CASES: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
    ("key LIKE 'eu-%' AND headers['region'] = 'eu' AND (value->>'amount')::DOUBLE > 100",
     lambda r: (r["key"] or "").startswith("eu-") and _header(r, "region") == "eu"
     and r["_doc"] is not None and r["_doc"]["amount"] > 100),
    ("json_extract_string(value, '$.customer.id') = 'c-3'",
     lambda r: r["_doc"] is not None and r["_doc"]["customer"]["id"] == "c-3"),
    ("value_text LIKE 'refund%'", lambda r: r["format"] == "text"),
    ("value IS NULL", lambda r: r["format"] != "json"),
    ("key IS NULL OR \"offset\" < 3", lambda r: r["key"] is None or r["offset"] < 3),
    ("timestamp >= TIMESTAMPTZ '2026-12-01 00:00:30+00' AND timestamp < TIMESTAMPTZ '2026-12-01 00:01:00+00'",
     lambda r: 30 <= (r["timestamp"] - T0).total_seconds() < 60),
]


@pytest.mark.parametrize(("predicate", "expected"), CASES)
def test_matching_finds_what_python_finds(tmp_path: Path, predicate: str,
                                          expected: Callable[[dict[str, Any]], bool]) -> None:
    rows = _rows()
    stored = pa.Table.from_pylist([{k: v for k, v in r.items() if k != "_doc"} for r in rows], TOPIC_SCHEMA)
    write_deltalake(str(tmp_path / "t"), stored, partition_by=["partition"])
    query = Query(str(tmp_path / "t"), check(predicate))
    for partition in range(3):
        want = [r for r in rows if r["partition"] == partition and expected(r)]
        found = query.matching(partition, 0, 1_000, 1_000).rows
        assert [r["offset"] for r in found] == [r["offset"] for r in want]
        assert [r["value"] for r in found] == [r["value"] for r in want]  # the stored bytes, not the view's JSON
        assert all(r["partition"] == partition and r["timestamp"].tzinfo is not None for r in found)
        # An offset range and a limit: the first matches at or after `start`, in offset order.
        later = [r["offset"] for r in want if 10 <= r["offset"] < 25][:4]
        assert [r["offset"] for r in query.matching(partition, 10, 25, 4).rows] == later


def test_a_time_range_bounds_the_scan_and_a_bad_cast_is_the_predicates_error(tmp_path: Path) -> None:
    rows = _rows()
    write_deltalake(str(tmp_path / "t"), pa.Table.from_pylist(
        [{k: v for k, v in r.items() if k != "_doc"} for r in rows], TOPIC_SCHEMA), partition_by=["partition"])
    timed = Query(str(tmp_path / "t"), None, since=T0 + timedelta(seconds=30), until=T0 + timedelta(seconds=33))
    assert [(r["partition"], r["offset"]) for p in range(3) for r in timed.matching(p, 0, 100, 100).rows] == [
        (0, 10), (1, 10), (2, 10)]
    with pytest.raises(InvalidPredicate, match="Cannot compare values of type VARCHAR"):
        Query(str(tmp_path / "t"), check("key > 5")).probe()
    with pytest.raises(InvalidPredicate, match="Could not convert string"):
        Query(str(tmp_path / "t"), check("value_text::INT > 5")).matching(1, 0, 100, 100)
    with pytest.raises(FileNotFoundError):  # a range was committed: a table gone is a fault, not "no match"
        Query(str(tmp_path / "missing"), None).matching(0, 0, 10, 10)
    Query(str(tmp_path / "missing"), check("key > '5'")).probe()  # binds against the columns alone


def test_the_example_of_the_docs() -> None:
    [example] = [b.text.strip() for b in code_blocks(DOCS / "webhooks.md")
                 if b.tested_by == "tests/tables/test_predicates.py"]
    assert example == CASES[0][0]  # and CASES checks what it matches against Python
    assert check(example).text == example


def _table(tmp_path: Path) -> str:
    rows = _rows()
    write_deltalake(str(tmp_path / "t"), pa.Table.from_pylist(
        [{k: v for k, v in r.items() if k != "_doc"} for r in rows], TOPIC_SCHEMA), partition_by=["partition"])
    return str(tmp_path / "t")


def test_no_parenthesis_in_a_predicate_reaches_past_the_range(tmp_path: Path) -> None:
    """What runs is the checked tree, as the WHERE over a FROM that holds the range."""
    uri = _table(tmp_path)
    for predicate in ("true) OR (true", '"offset" > 100) OR ("offset" < 5'):
        checked = check(predicate)
        assert checked.text == predicate
        found = Query(uri, checked).matching(1, 20, 25, 100)
        assert [r["offset"] for r in found.rows] == ([20, 21, 22, 23, 24] if "true" in predicate else [])
        assert found.next_offset == 25


def test_a_call_stops_at_its_limit_or_its_scan_window_and_says_where_to_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = _table(tmp_path)
    query = Query(uri, check("key IS NOT NULL"))
    first = query.matching(0, 0, 30, 4)  # keys are null at offsets 0 and 11 of partition 0
    assert [r["offset"] for r in first.rows] == [1, 2, 3, 4] and first.next_offset == 5
    monkeypatch.setattr("lakebroker.tables.predicates.SCAN_OFFSETS", 10)
    windowed = query.matching(0, 5, 30, 100)
    assert [r["offset"] for r in windowed.rows] == [5, 6, 7, 8, 9, 10, 12, 13, 14] and windowed.next_offset == 15


def test_times_are_utc_whatever_the_hosts_zone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = _table(tmp_path)
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        day = Query(uri, check("date_trunc('day', timestamp) = TIMESTAMPTZ '2026-12-01 00:00:00+00'"))
        assert len(day.matching(2, 0, 100, 100).rows) == 30
    finally:
        monkeypatch.undo()
        time.tzset()
