"""Subscription filters: Pub/Sub's filter language over a message's key, headers and JSON value.

    hasPrefix(key, "eu-") AND headers.region = "eu" AND (value.amount > 100 OR NOT value:coupon)

A filter is parsed once (`parse`, with lark) into a tree of tests, and evaluated over a whole Arrow
table of the topic's rows at once (`Filter.matches`): each test is a pyarrow.compute kernel over a
column, and AND, OR and NOT combine their boolean arrays. A JSON value is decoded once per row for
the fields the filter names, only when it names any. The grammar and its meaning are documented
in docs/webhooks.md ("Filters").

- `key` takes `=`, `!=`, `IN (...)` and `hasPrefix`.
- `headers.NAME` takes the same, and `headers:NAME` is true when the header is present.
- `value.a.b` (a field of a JSON value, nested by dots; a name that is not an identifier is quoted:
  `value."unit price"`) takes `=`, `!=`, `<`, `<=`, `>`, `>=` (numbers with numbers, strings with
  strings), `IN (...)` and `hasPrefix`; `value.a:b` is true when the object `value.a` has a field `b`.
- A test of something missing (no key, no such header or field, a value that is not JSON, a value
  of another type than the literal's) is false, except `!=`, which is always `NOT (... = ...)`.
- NOT binds tightest, then AND, then OR; parentheses group. Keywords are upper case.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from lark import Lark, Token, Transformer, UnexpectedEOF, UnexpectedInput, UnexpectedToken, v_args
from lark.tree import Meta

from lakebroker.tables.errors import InvalidRequest

MAX_FILTER_CHARS = 1024

GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr -> negation
         | "-" not_expr -> negation
         | _primary
_primary: "(" or_expr ")" | comparison | membership | presence | prefix
comparison: field COMPARATOR literal
membership: field _IN "(" literal ("," literal)* ")"
presence: field ":" name
prefix: _HASPREFIX "(" field "," STRING ")"
field: NAME ("." name)*
?name: NAME | STRING
?literal: STRING | NUMBER | TRUE | FALSE | NULL

_OR.2: "OR"
_AND.2: "AND"
_NOT.2: "NOT"
_IN.2: "IN"
_HASPREFIX.2: "hasPrefix"
TRUE.2: "true"
FALSE.2: "false"
NULL.2: "null"
COMPARATOR: "<=" | ">=" | "!=" | "=" | "<" | ">"
NAME: /[A-Za-z_][A-Za-z0-9_-]*/
STRING: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4})*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/

%import common.WS
%ignore WS
"""


class InvalidFilter(InvalidRequest):
    status = 422  # a field that fails validation, as the request model's own checks answer
    code = "invalid_filter"


Scalar = str | float | bool | None


@dataclass(frozen=True)
class Path:
    """`key`, `headers.NAME` or `value.a.b`."""

    root: str
    names: tuple[str, ...] = ()

    def __str__(self) -> str:
        return ".".join((self.root, *self.names))


@dataclass(frozen=True)
class Compare:
    path: Path
    op: str
    literal: Scalar


@dataclass(frozen=True)
class In:
    path: Path
    literals: tuple[Scalar, ...]


@dataclass(frozen=True)
class Prefix:
    path: Path
    prefix: str


@dataclass(frozen=True)
class Present:
    path: Path


@dataclass(frozen=True)
class Not:
    test: Test


@dataclass(frozen=True)
class All:
    tests: tuple[Test, ...]


@dataclass(frozen=True)
class Any_:
    tests: tuple[Test, ...]


Test = Compare | In | Prefix | Present | Not | All | Any_
MISSING = object()  # a JSON value without the field
ORDERING = {"<", "<=", ">", ">="}


def _at(meta: Meta | Token) -> str:
    return f"at column {meta.column}"


@v_args(meta=True)
class _Build(Transformer[Token, Test]):
    """The parse tree into tests, refusing what parses but means nothing (`key > 1`, `headers.a.b`)."""

    def field(self, meta: Meta, parts: list[Any]) -> tuple[Path, Meta]:
        root = str(parts[0])
        if root not in ("key", "headers", "value"):
            raise InvalidFilter(f"filter: unknown field {root!r} ({_at(meta)}); use key, headers.NAME or "
                                "value.NAME")
        return Path(root, tuple(_name(p) for p in parts[1:])), meta

    def comparison(self, meta: Meta, parts: list[Any]) -> Test:
        (path, at), op, literal = parts
        _tested(path, at)
        value = _literal(literal)
        if op in ORDERING:
            if path.root != "value":
                raise InvalidFilter(f"filter: {op} compares value fields only, not {path} ({_at(at)})")
            if isinstance(value, bool) or value is None:
                raise InvalidFilter(f"filter: {op} compares with a number or a string ({_at(literal)})")
        else:
            self._textual(path, value, literal)
        test: Test = Compare(path, "=" if op == "!=" else str(op), value)
        return Not(test) if op == "!=" else test

    def membership(self, meta: Meta, parts: list[Any]) -> Test:
        (path, at), *literals = parts
        _tested(path, at)
        values = tuple(_literal(t) for t in literals)
        for value, token in zip(values, literals, strict=True):
            self._textual(path, value, token)
        return In(path, values)

    def presence(self, meta: Meta, parts: list[Any]) -> Test:
        (path, at), name = parts
        if path.root != "value" and str(path) != "headers":
            raise InvalidFilter(f"filter: presence is `headers:NAME` or `value:NAME` ({_at(at)})")
        if path.root == "headers":
            return Present(Path("headers", (_name(name),)))
        return Present(Path("value", (*path.names, _name(name))))

    def prefix(self, meta: Meta, parts: list[Any]) -> Test:
        (path, at), prefix = parts
        _tested(path, at)
        return Prefix(path, _literal(prefix))  # type: ignore[arg-type]

    def negation(self, meta: Meta, parts: list[Any]) -> Test:
        return Not(parts[0])

    def and_expr(self, meta: Meta, parts: list[Any]) -> Test:
        return All(tuple(parts))

    def or_expr(self, meta: Meta, parts: list[Any]) -> Test:
        return Any_(tuple(parts))

    @staticmethod
    def _textual(path: Path, value: Scalar, token: Token) -> None:
        if path.root != "value" and not isinstance(value, str):
            raise InvalidFilter(f"filter: {path} is text; compare it with a string ({_at(token)})")


def _tested(path: Path, at: Meta) -> None:
    """`path` names one thing a test can look at."""
    if path.root == "key" and path.names:
        raise InvalidFilter(f"filter: `key` has no fields ({_at(at)})")
    if path.root == "headers" and len(path.names) != 1:
        raise InvalidFilter(f"filter: a header is `headers.NAME` ({_at(at)})")
    if path.root == "value" and not path.names:
        raise InvalidFilter(f"filter: a value field is `value.NAME` ({_at(at)})")


def _name(token: Token) -> str:
    return str(_json(token)) if token.type == "STRING" else str(token)


def _literal(token: Token) -> Scalar:
    if token.type == "NUMBER":
        number = float(token.value)
        if not math.isfinite(number):
            raise InvalidFilter(f"filter: {token.value} is out of range ({_at(token)})")
        return number
    return _json(token)  # type: ignore[no-any-return]  # a string, true, false or null


def _json(token: Token) -> Any:
    try:
        return orjson.loads(token.value)
    except orjson.JSONDecodeError:  # a lone surrogate escape: no text holds it
        raise InvalidFilter(f"filter: {token.value} is not a valid string ({_at(token)})") from None


@cache
def _parser() -> Lark:
    return Lark(GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=False)


@lru_cache(maxsize=1024)  # every load of the subscriptions validates theirs
def parse(text: str) -> Filter:
    """The filter `text` means; InvalidFilter (422) naming the column of the first mistake."""
    if not text.strip():
        raise InvalidFilter("filter: empty; leave it out (or null) to deliver every message")
    if len(text) > MAX_FILTER_CHARS:
        raise InvalidFilter(f"filter: {len(text)} characters, over the {MAX_FILTER_CHARS} allowed")
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        if (isinstance(exc, UnexpectedToken) and exc.token.type == "$END") or isinstance(exc, UnexpectedEOF):
            raise InvalidFilter(f"filter: it ends where more was expected (column {len(text) + 1})") from None
        start = exc.pos_in_stream or 0
        raise InvalidFilter(f"filter: unexpected {text[start:start + 12]!r} at column {exc.column}") from None
    try:
        test = _Build().transform(tree)
    except Exception as exc:  # lark wraps the transformer's own errors
        cause = getattr(exc, "orig_exc", exc)
        if isinstance(cause, InvalidFilter):
            raise cause from None
        raise
    return Filter(text, test)


@dataclass(frozen=True)
class Filter:
    text: str
    test: Test

    def matches(self, rows: pa.Table) -> pa.BooleanArray:
        """Per row of `rows` (a topic table's columns: key, headers, value, format), whether it matches."""
        values = _ValueFields(rows, _value_paths(self.test))
        return _evaluate(self.test, rows, values)


def _value_paths(test: Test) -> set[tuple[str, ...]]:
    if isinstance(test, Compare | In | Prefix | Present):
        if test.path.root != "value":
            return set()
        return {test.path.names}
    inner = (test.test,) if isinstance(test, Not) else test.tests
    return set().union(*map(_value_paths, inner))


class _ValueFields:
    """The named fields of each row's JSON value, decoded once per row (MISSING where absent)."""

    def __init__(self, rows: pa.Table, paths: set[tuple[str, ...]]) -> None:
        self.fields: dict[tuple[str, ...], list[Any]] = {}
        if not paths:
            return
        is_json = pc.equal(rows.column("format"), "json").to_pylist()
        decoded = [_decode(v) if j else MISSING for v, j in zip(rows.column("value").to_pylist(), is_json,
                                                                  strict=True)]
        for path in paths:
            self.fields[path] = [_lookup(d, path) for d in decoded]


def _decode(value: bytes | None) -> Any:
    if value is None:
        return MISSING
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return MISSING


def _lookup(document: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(document, dict) or name not in document:
            return MISSING
        document = document[name]
    return document


def _evaluate(test: Test, rows: pa.Table, values: _ValueFields) -> pa.BooleanArray:
    if isinstance(test, Not):
        return pc.invert(_evaluate(test.test, rows, values))
    if isinstance(test, All | Any_):
        combine: Callable[[Any, Any], Any] = pc.and_ if isinstance(test, All) else pc.or_
        result = _evaluate(test.tests[0], rows, values)
        for inner in test.tests[1:]:
            result = combine(result, _evaluate(inner, rows, values))
        return result
    if test.path.root == "value":
        return _value_test(test, values.fields[test.path.names])
    column = _text_column(rows, test.path)
    if isinstance(test, Present):
        mask = pc.is_valid(column)
    elif isinstance(test, Compare):
        mask = pc.equal(column, test.literal)
    elif isinstance(test, In):
        mask = pc.is_in(column, value_set=pa.array(test.literals, pa.string()))
    else:
        mask = pc.starts_with(column, test.prefix)
    return _no_nulls(mask)


def _text_column(rows: pa.Table, path: Path) -> pa.Array:
    if path.root == "key":
        return rows.column("key").combine_chunks()
    headers = rows.column("headers").combine_chunks()
    return pc.map_lookup(headers, pa.scalar(path.names[0], pa.string()), "first")


def _value_test(test: Compare | In | Prefix | Present, found: list[Any]) -> pa.BooleanArray:
    if isinstance(test, Present):
        return pa.array([v is not MISSING for v in found], pa.bool_())
    if isinstance(test, Prefix):
        return _no_nulls(pc.starts_with(_typed(found, str), test.prefix))
    literals: Sequence[Scalar] = test.literals if isinstance(test, In) else (test.literal,)
    op = test.op if isinstance(test, Compare) else "="
    mask: pa.BooleanArray | None = None
    for literal in literals:
        one = _value_compare(found, op, literal)
        mask = one if mask is None else pc.or_(mask, one)
    assert mask is not None
    return mask


def _value_compare(found: list[Any], op: str, literal: Scalar) -> pa.BooleanArray:
    if literal is None:
        return pa.array([v is None for v in found], pa.bool_())
    if isinstance(literal, bool):
        return pa.array([v is literal for v in found], pa.bool_())
    kind: type = str if isinstance(literal, str) else float
    column = _typed(found, kind)
    kernel = {"=": pc.equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}[op]
    return _no_nulls(kernel(column, literal))


def _typed(found: list[Any], kind: type) -> pa.Array:
    """The fields of type `kind` (numbers as float64; JSON's true and false are not numbers), null
    where absent or of another type."""
    if kind is str:
        return pa.array([v if isinstance(v, str) else None for v in found], pa.string())
    return pa.array([v if isinstance(v, int | float) and not isinstance(v, bool) else None for v in found],
                    pa.float64())


def _no_nulls(mask: Any) -> pa.BooleanArray:
    return pc.fill_null(mask, False)
