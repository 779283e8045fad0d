"""Subscription filters (tables/filters.py): random filters over random rows, evaluated in bulk over
Arrow, must agree with a plain evaluation of each row in Python; and every filter that means
nothing is refused with the column of its mistake."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakebroker.tables.filters import InvalidFilter, parse
from tests.markdown_blocks import code_blocks

DOCS = Path(__file__).resolve().parents[2] / "docs"
KEYS = [None, "", "e", "eu-1", "eu-2", "us-1", "ключ"]
HEADER_NAMES = ["region", "tier", "x-trace"]
HEADER_VALUES = ["", "eu", "eu-west", "us", "gold"]
STRINGS = ["", "e", "de", "fr", "eu-x", "100", "Ünï"]
NUMBERS = [-3, 0, 1, 2.5, 99, 100, 100.0, 150]
MISSING = object()

# -- rows -------------------------------------------------------------------------------------

field_value = st.one_of(st.sampled_from(NUMBERS), st.sampled_from(STRINGS), st.booleans(), st.none(),
                        st.just(MISSING))


@st.composite
def rows(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["object", "object", "object", "array", "text", "bad json"]))
    if kind == "object":
        doc = {name: v for name in ("amount", "country")
               if (v := draw(field_value)) is not MISSING}
        if draw(st.booleans()):
            doc["order"] = {"id": draw(st.sampled_from(NUMBERS))}
        value, fmt = orjson.dumps(doc), "json"
    elif kind == "array":
        value, fmt = b"[1, 2]", "json"
    elif kind == "text":
        value, fmt = b"amount=100", "text"
    else:
        value, fmt = b"{not json", "json"
    headers = draw(st.one_of(st.none(), st.dictionaries(st.sampled_from(HEADER_NAMES),
                                                        st.sampled_from(HEADER_VALUES), max_size=3)))
    return {"key": draw(st.sampled_from(KEYS)), "headers": headers, "value": value, "format": fmt}


def as_table(batch: list[dict[str, Any]]) -> pa.Table:
    return pa.table({
        "key": pa.array([r["key"] for r in batch], pa.string()),
        "headers": pa.array([None if r["headers"] is None else list(r["headers"].items()) for r in batch],
                            pa.map_(pa.string(), pa.string())),
        "value": pa.array([r["value"] for r in batch], pa.binary()),
        "format": pa.array([r["format"] for r in batch], pa.string()),
    })


# -- filters: the text, and the plain meaning of it ------------------------------------------

Predicate = Callable[[dict[str, Any]], bool]
COMPARE: dict[str, Callable[[Any, Any], bool]] = {"<": operator.lt, "<=": operator.le, ">": operator.gt,
                                                  ">=": operator.ge}


def _text(literal: Any) -> str:
    return json.dumps(literal, ensure_ascii=False)


def _field(row: dict[str, Any], path: tuple[str, ...]) -> Any:
    if row["format"] != "json":
        return MISSING
    try:
        doc: Any = json.loads(row["value"])
    except ValueError:
        return MISSING
    for name in path:
        if not isinstance(doc, dict) or name not in doc:
            return MISSING
        doc = doc[name]
    return doc


def _same(found: Any, literal: Any) -> bool:
    """A JSON field equal to a literal of its own JSON type (numbers with numbers)."""
    if literal is None or isinstance(literal, bool):
        return found is literal
    if isinstance(literal, str):
        return isinstance(found, str) and found == literal
    return isinstance(found, int | float) and not isinstance(found, bool) and found == literal


@st.composite
def leaves(draw: st.DrawFn) -> tuple[str, Predicate]:
    kind = draw(st.sampled_from(["key =", "key !=", "key IN", "key prefix", "header =", "header !=",
                                 "header present", "header prefix", "value cmp", "value =", "value !=",
                                 "value IN", "value present", "value prefix"]))
    string = draw(st.sampled_from([*STRINGS, "eu-", "eu", "u"]))
    if kind.startswith("key"):
        if kind == "key IN":
            options = draw(st.lists(st.sampled_from(KEYS[1:]), min_size=1, max_size=3))
            return (f"key IN ({', '.join(map(_text, options))})", lambda r: r["key"] in options)
        if kind == "key prefix":
            return (f"hasPrefix(key, {_text(string)})",
                    lambda r: r["key"] is not None and r["key"].startswith(string))
        literal = draw(st.sampled_from(KEYS[1:]))
        eq: Predicate = lambda r: r["key"] == literal  # noqa: E731
        return (f"key = {_text(literal)}", eq) if kind == "key =" else (f"key != {_text(literal)}",
                                                                       lambda r: not eq(r))
    if kind.startswith("header"):
        name = draw(st.sampled_from(HEADER_NAMES))
        shown = f'"{name}"' if "-" in name and draw(st.booleans()) else name

        def header(r: dict[str, Any]) -> str | None:
            return None if r["headers"] is None else r["headers"].get(name)

        if kind == "header present":
            return f"headers:{shown}", lambda r: header(r) is not None
        if kind == "header prefix":
            return (f"hasPrefix(headers.{shown}, {_text(string)})",
                    lambda r: (h := header(r)) is not None and h.startswith(string))
        literal = draw(st.sampled_from(HEADER_VALUES))
        is_eq: Predicate = lambda r: header(r) == literal  # noqa: E731
        return ((f"headers.{shown} = {_text(literal)}", is_eq) if kind == "header =" else
                (f"headers.{shown} != {_text(literal)}", lambda r: not is_eq(r)))
    path = draw(st.sampled_from([("amount",), ("country",), ("order", "id")]))
    name = ".".join(path)
    if kind == "value present":
        *parent, last = path
        at = ".".join(["value", *parent])
        return f"{at}:{last}", lambda r: _field(r, path) is not MISSING
    if kind == "value prefix":
        return (f"hasPrefix(value.{name}, {_text(string)})",
                lambda r: isinstance(f := _field(r, path), str) and f.startswith(string))
    if kind == "value cmp":
        op = draw(st.sampled_from(sorted(COMPARE)))
        literal = draw(st.one_of(st.sampled_from(NUMBERS), st.sampled_from(STRINGS)))
        kind_of = str if isinstance(literal, str) else (int, float)

        def cmp(r: dict[str, Any]) -> bool:
            f = _field(r, path)
            return isinstance(f, kind_of) and not isinstance(f, bool) and COMPARE[op](f, literal)

        return f"value.{name} {op} {_text(literal)}", cmp
    literals = draw(st.lists(st.one_of(st.sampled_from(NUMBERS), st.sampled_from(STRINGS), st.booleans(),
                                       st.none()), min_size=1, max_size=3))
    if kind == "value IN":
        return (f"value.{name} IN ({', '.join(map(_text, literals))})",
                lambda r: any(_same(_field(r, path), lit) for lit in literals))
    literal = literals[0]
    same: Predicate = lambda r: _same(_field(r, path), literal)  # noqa: E731
    return ((f"value.{name} = {_text(literal)}", same) if kind == "value =" else
            (f"value.{name} != {_text(literal)}", lambda r: not same(r)))


def combined(children: st.SearchStrategy[tuple[str, Predicate]]) -> st.SearchStrategy[tuple[str, Predicate]]:
    def negated(c: tuple[str, Predicate], dash: bool) -> tuple[str, Predicate]:
        return f"{'-' if dash else 'NOT '}({c[0]})", lambda r: not c[1](r)

    def joined(cs: list[tuple[str, Predicate]], both: bool) -> tuple[str, Predicate]:
        text = (" AND " if both else " OR ").join(f"({t})" for t, _ in cs)
        return text, (lambda r: all(p(r) for _, p in cs)) if both else (lambda r: any(p(r) for _, p in cs))

    return st.one_of(st.builds(negated, children, st.booleans()),
                     st.builds(joined, st.lists(children, min_size=2, max_size=3), st.booleans()))


filters = st.recursive(leaves(), combined, max_leaves=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(filters, st.lists(rows(), min_size=1, max_size=40))
def test_a_filter_over_arrow_agrees_with_the_rows_one_by_one(f: tuple[str, Predicate],
                                                             batch: list[dict[str, Any]]) -> None:
    text, predicate = f
    got = parse(text).matches(as_table(batch)).to_pylist()
    assert got == [predicate(r) for r in batch], text


def test_not_binds_tighter_than_and_which_binds_tighter_than_or() -> None:
    batch = [{"key": k, "headers": None, "value": b"{}", "format": "json"} for k in ("a", "b", "c")]
    table = as_table(batch)
    assert parse('key = "a" OR key = "b" AND key = "c"').matches(table).to_pylist() == [True, False, False]
    assert parse('NOT key = "a" AND NOT key = "b"').matches(table).to_pylist() == [False, False, True]
    assert parse('(key = "a" OR key = "b") AND NOT key = "b"').matches(table).to_pylist() == [True, False, False]


def test_the_example_of_the_docs() -> None:
    [example] = [b.text.strip() for b in code_blocks(DOCS / "webhooks.md")
                 if b.tested_by == "tests/tables/test_filters.py"]
    batch = [
        {"key": "eu-7", "headers": {"region": "eu"}, "value": b'{"amount": 120}', "format": "json"},
        {"key": "eu-8", "headers": {"region": "eu"}, "value": b'{"amount": 80}', "format": "json"},
        {"key": "us-1", "headers": {"region": "eu"}, "value": b'{"amount": 500}', "format": "json"},
        {"key": "eu-9", "headers": None, "value": b'{"amount": 500}', "format": "json"},
    ]
    f = parse(example)
    assert f.matches(as_table(batch)).to_pylist() == [True, False, False, False]


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty"),
    ("   ", "empty"),
    ('key > "a"', "> compares value fields only, not key (at column 1)"),
    ('headers.region < "b"', "< compares value fields only, not headers.region (at column 1)"),
    ("value.amount > true", "compares with a number or a string (at column 16)"),
    ('headers.a.b = "x"', "a header is `headers.NAME` (at column 1)"),
    ("value = 3", "a value field is `value.NAME` (at column 1)"),
    ('key.a = "x"', "`key` has no fields (at column 1)"),
    ('topic = "x"', "unknown field 'topic' (at column 1)"),
    ("key = 1", "key is text; compare it with a string (at column 7)"),
    ("key:x", "presence is `headers:NAME` or `value:NAME` (at column 1)"),
    ('key = "a" AND', "it ends where more was expected (column 14)"),
    ('(key = "a"', "it ends where more was expected (column 11)"),
    ('key = "a" and key = "b"', "unexpected 'and key = \"b' at column 11"),
    ("key = 'a'", "unexpected \"'a'\" at column 7"),
    ('key = "a" # x', "unexpected '# x' at column 11"),
    ("x" * 1025, "1025 characters, over the 1024 allowed"),
    ('key = "\\ud800"', 'filter: "\\ud800" is not a valid string (at column 7)'),
    ('value."\\udfff" = 1', 'filter: "\\udfff" is not a valid string (at column 7)'),
    ("value.a > 1e999", "filter: 1e999 is out of range (at column 11)"),
    ('key = "\x00"', "unexpected '\"\\x00\"' at column 7"),
])
def test_a_filter_that_means_nothing_is_refused_where_it_goes_wrong(text: str, message: str) -> None:
    with pytest.raises(InvalidFilter) as raised:
        parse(text)
    assert raised.value.status == 422
    assert message in raised.value.message, raised.value.message
