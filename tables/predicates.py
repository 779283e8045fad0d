"""SQL predicates over a topic's table: checked once, then run by DuckDB over the table's files as
delta-rs lists them, inside the process, with no JVM.

A predicate is the WHERE clause of a query on one view, `messages`, of the topic's table:

    partition, offset, timestamp, key, headers (a map: headers['region']), format,
    message_id, producer_id, sequence,
    value        the value as JSON (json messages; NULL for text and binary ones):
                 value->>'region', (value->>'amount')::DOUBLE, value.customer.id
    value_text   the value as text (json and text messages; NULL for binary ones)

`check` parses it with DuckDB's own parser (json_serialize_sql) and walks the tree: column
references to the view's columns, constants, operators, casts, CASE, and the functions of
ALLOWED_FUNCTIONS; no subquery, no other table, no parameter, no function that reads a file or
the network. The connection that runs it also refuses every file and network access
(`enable_external_access`), so even a construct the walk missed could read nothing but the view.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lakebroker.tables import delta
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.filters import Filter
from lakebroker.tables.schemas import TOPIC_SCHEMA

MAX_PREDICATE_CHARS = 4096
COLUMNS = frozenset({"partition", "offset", "timestamp", "key", "headers", "format", "message_id", "producer_id",
                     "sequence", "value", "value_text"})
# Pure functions of their arguments (and the clock): text, numbers, JSON, maps, time.
ALLOWED_FUNCTIONS = frozenset({
    "~~", "!~~", "~~*", "!~~*", "~~~", "!~~~", "like_escape", "not_like_escape", "ilike_escape",
    "regexp_matches", "regexp_full_match", "starts_with", "prefix", "suffix", "ends_with", "contains",
    "lower", "upper", "lcase", "ucase", "length", "strlen", "trim", "ltrim", "rtrim", "substring", "substr",
    "concat", "||", "left", "right", "replace", "split_part",
    "+", "-", "*", "/", "//", "%", "abs", "round", "floor", "ceil", "ceiling", "least", "greatest",
    "->", "->>", "json_extract", "json_extract_string", "json_extract_path", "json_extract_path_text",
    "json_exists", "json_value", "json_type", "json_array_length", "json_contains", "json_keys", "json_valid",
    "map_extract", "map_extract_value", "element_at", "array_extract", "map_contains", "map_keys",
    "map_values", "cardinality", "list_contains", "array_contains", "len", "array_length",
    "now", "current_timestamp", "get_current_timestamp", "epoch_ms", "epoch", "epoch_us", "to_timestamp",
    "make_timestamp", "make_timestamptz", "date_trunc", "date_part", "datepart", "to_days", "to_hours",
    "to_minutes", "to_seconds", "to_milliseconds", "to_microseconds", "to_years", "to_months", "to_weeks",
    "trunc", "try_strptime", "strptime",
    "hash", "md5", "isnan", "isinf", "coalesce", "ifnull", "nullif",
})
_ALLOWED_CLASSES = frozenset({"COLUMN_REF", "CONSTANT", "COMPARISON", "CONJUNCTION", "OPERATOR", "CAST",
                              "FUNCTION", "BETWEEN", "CASE", "TYPE"})  # TYPE: a cast's target type
_PREFIX = "SELECT 1 FROM messages WHERE (\n"  # the newline ends a trailing -- comment before the ")"
_VIEW = """CREATE VIEW messages AS SELECT "partition", "offset", "timestamp", key, headers, format, message_id,
    producer_id, sequence,
    CASE WHEN format = 'json' THEN TRY_CAST(TRY(decode(value)) AS JSON) END AS value,
    CASE WHEN format <> 'binary' THEN TRY(decode(value)) END AS value_text,
    value AS __value
FROM rows"""
_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False, "autoinstall_known_extensions": False, "autoload_known_extensions": False,
    "threads": 1, "memory_limit": "256MB"}


class InvalidPredicate(InvalidRequest):
    status = 422
    code = "invalid_predicate"


def _connect() -> Any:
    import duckdb  # imported when a replay runs: serve does not map DuckDB's library otherwise

    return duckdb.connect(":memory:", config=_CONFIG)


def check(predicate: str) -> str:
    """`predicate`, if it is a read-only expression over the view's columns; else InvalidPredicate
    with the reason."""
    text = predicate.strip()
    if not text:
        raise InvalidPredicate("where: the predicate is empty")
    if len(text) > MAX_PREDICATE_CHARS:
        raise InvalidPredicate(f"where: {len(text):,} characters; at most {MAX_PREDICATE_CHARS:,}")
    if "\x00" in text:
        raise InvalidPredicate("where: a NUL character")
    con = _connect()
    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql($1)", [_PREFIX + text + "\n)"]).fetchone()[0])
    finally:
        con.close()
    if tree.get("error"):
        raise InvalidPredicate(f"where: {tree.get('error_message', 'not a valid expression')}")
    statements = tree["statements"]
    node = statements[0]["node"] if len(statements) == 1 else {}
    if (node.get("type") != "SELECT_NODE" or node.get("cte_map", {}).get("map") or node.get("modifiers")
            or node.get("group_expressions") or node.get("having") or node.get("qualify")
            or (node.get("from_table") or {}).get("table_name") != "messages" or len(node.get("select_list", [])) != 1):
        raise InvalidPredicate("where: not one expression (a predicate is what follows WHERE, nothing more)")
    _walk(node["where_clause"])
    return text


def _walk(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("class")
    if kind is not None:
        if kind == "SUBQUERY":
            raise InvalidPredicate("where: subqueries are not allowed; a predicate reads one message's columns")
        if kind not in _ALLOWED_CLASSES:
            raise InvalidPredicate(f"where: {kind.lower().replace('_', ' ')} expressions are not allowed")
        if kind == "COLUMN_REF":
            name = node["column_names"][0].lower()
            if name not in COLUMNS:
                raise InvalidPredicate(f"where: no column {node['column_names'][0]!r}; the columns are "
                                       + ", ".join(sorted(COLUMNS)))
        if kind == "FUNCTION":
            name = node["function_name"].lower()
            if name not in ALLOWED_FUNCTIONS or node.get("schema") or node.get("catalog"):
                raise InvalidPredicate(f"where: the function {node['function_name']!r} is not allowed")
            if node.get("filter") or node.get("distinct") or (node.get("order_bys") or {}).get("orders"):
                raise InvalidPredicate(f"where: {node['function_name']!r} as an aggregate is not allowed")
    for value in node.values():
        if isinstance(value, dict | list):
            _walk(value)


@dataclass(frozen=True)
class Matches:
    rows: list[dict[str, Any]]  # the matching messages, each a row of the topic table, in offset order
    next_offset: int  # where the scan goes on: every offset below it was looked at


class Query:
    """One predicate (and an optional time range) over one topic table, run a partition's offset
    range at a time. `keep`: the subscription's own filter (tables/filters.py), applied after it."""

    def __init__(self, uri: str, predicate: str | None, since: datetime | None = None,
                 until: datetime | None = None, *, keep: Filter | None = None) -> None:
        self.uri = uri
        self.predicate = predicate
        self.since, self.until = since, until
        self.keep = keep

    def matching(self, partition: int, start: int, end: int, limit: int) -> Matches:
        """Up to `limit` messages at or after `start` and before `end` in `partition` that the
        predicate (and `keep`) keep, in offset order."""
        table = delta.open_table(self.uri)
        if table is None or start >= end:
            return Matches([], end)
        dataset = table.to_pyarrow_dataset(
            file_pruning_predicate=f'partition = {int(partition)} AND "offset" >= {int(start)} '
                                   f'AND "offset" < {int(end)}')
        import duckdb

        con = _connect()
        try:
            con.register("rows", dataset)
            con.execute(_VIEW)
            clauses = ['"partition" = $1', '"offset" >= $2', '"offset" < $3']
            args: list[int | datetime] = [partition, start, end]
            for op, at in ((">=", self.since), ("<", self.until)):
                if at is not None:
                    args.append(at)
                    clauses.append(f'"timestamp" {op} ${len(args)}')
            if self.predicate is not None:
                clauses.append(f"(\n{self.predicate}\n)")
            args.append(limit)
            names = ", ".join(f'"{n}"' if n != "value" else "__value AS value" for n in TOPIC_SCHEMA.names)
            found = con.sql(f"SELECT {names} FROM messages WHERE {' AND '.join(clauses)} "
                            f'ORDER BY "offset" LIMIT ${len(args)}', params=args).to_arrow_table()
        except duckdb.Error as exc:  # the predicate's own error (a type, a cast of a value)
            raise InvalidPredicate(f"where: {_first_line(exc)}") from None
        finally:
            con.close()
        found = found.cast(TOPIC_SCHEMA)
        next_offset = found.column("offset")[-1].as_py() + 1 if limit and found.num_rows == limit else end
        if self.keep is not None and found.num_rows:
            found = found.filter(self.keep.matches(found))
        return Matches(found.to_pylist(), next_offset)

    def probe(self) -> None:
        """Bind the predicate against the table (types, functions) reading no row: the errors
        DuckDB finds only then (`key > 5`) are the caller's, refused before a replay runs."""
        self.matching(0, 0, 1, 0)


def _first_line(exc: Exception) -> str:
    return next(iter(str(exc).strip().splitlines()), type(exc).__name__)[:500]
