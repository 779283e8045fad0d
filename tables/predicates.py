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
ALLOWED_FUNCTIONS (none that reads a file or the network, none that grows a value without bound);
no subquery, no other table, no parameter, no clause beside the expression. What runs is not the
text given but the checked tree rendered back to SQL (json_deserialize_sql), as the WHERE of a
query whose FROM already holds the partition and offset range: nothing the walk did not see runs,
and no parenthesis in the text can reach the range. The connection also refuses every file and
network access (`enable_external_access`) and runs in UTC.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

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
    "left", "right", "split_part",
    "+", "-", "*", "/", "//", "%", "abs", "round", "floor", "ceil", "ceiling", "least", "greatest",
    "->>", "json_extract", "json_extract_string", "json_extract_path", "json_extract_path_text",
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
_RENDERED = "SELECT 1 FROM messages WHERE "
MAX_DEPTH = 64  # nested expressions in a predicate
SCAN_OFFSETS = 50_000  # offsets one call of Query.matching looks at, at most: a chunk costs a bounded scan
# The errors of the predicate itself (a type, a cast a value refuses); others (I/O, memory) are retried.
_PREDICATE_ERRORS = ("BinderException", "CatalogException", "ConversionException", "InvalidInputException",
                     "OutOfRangeException", "ParserException", "TypeMismatchException", "NotImplementedException")
_READ_FAILED = "reading the stream registered as"
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

    con = duckdb.connect(":memory:", config=_CONFIG)
    con.execute("SET TimeZone = 'UTC'")  # time functions and casts as in UTC, whatever the host's zone
    return con


@dataclass(frozen=True)
class Predicate:
    """A checked predicate: the text as given (kept and shown) and its tree rendered back to SQL (run)."""

    text: str
    sql: str


def check(predicate: str) -> Predicate:
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
        tree = _parsed(con, _PREFIX + text + "\n)")
        template = _parsed(con, _PREFIX + "true\n)")
        node = _one_select(tree)
        if node is None or _shape(node) != _shape(_one_select(template)):
            raise InvalidPredicate("where: not one expression (a predicate is what follows WHERE, nothing more)")
        _walk(node["where_clause"], 0)
        _one_select(template)["where_clause"] = node["where_clause"]  # type: ignore[index]
        sql = con.execute("SELECT json_deserialize_sql($1::JSON)", [json.dumps(template)]).fetchone()[0]
    finally:
        con.close()
    if not sql.startswith(_RENDERED):
        raise InvalidPredicate("where: not one expression (a predicate is what follows WHERE, nothing more)")
    return Predicate(text, str(sql[len(_RENDERED):]))


def _parsed(con: Any, sql: str) -> dict[str, Any]:
    try:
        tree: dict[str, Any] = json.loads(con.execute("SELECT json_serialize_sql($1)", [sql]).fetchone()[0])
    except RecursionError:
        raise InvalidPredicate(f"where: nested more than {MAX_DEPTH} deep") from None
    if tree.get("error"):
        raise InvalidPredicate(f"where: {tree.get('error_message', 'not a valid expression')}")
    return tree


def _one_select(tree: dict[str, Any]) -> dict[str, Any] | None:
    statements = tree["statements"]
    node = statements[0]["node"] if len(statements) == 1 else None
    return node if node is not None and node.get("type") == "SELECT_NODE" else None


def _shape(node: dict[str, Any] | None) -> Any:
    """Everything of the statement but its WHERE, without source positions."""

    def bare(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: bare(v) for k, v in value.items() if not k.startswith("query_location")}
        if isinstance(value, list):
            return [bare(v) for v in value]
        return value

    return None if node is None else bare({k: v for k, v in node.items() if k != "where_clause"})


def _walk(node: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InvalidPredicate(f"where: nested more than {MAX_DEPTH} deep")
    if isinstance(node, list):
        for item in node:
            _walk(item, depth)
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
            _walk(value, depth + 1)


@dataclass(frozen=True)
class Matches:
    rows: list[dict[str, Any]]  # the matching messages, each a row of the topic table, in offset order
    next_offset: int  # where the scan goes on: every offset below it was looked at


class Query:
    """One predicate (and an optional time range) over one topic table, run a partition's offset
    range at a time. `keep`: the subscription's own filter (tables/filters.py), applied after it."""

    def __init__(self, uri: str, predicate: Predicate | None, since: datetime | None = None,
                 until: datetime | None = None, *, keep: Filter | None = None) -> None:
        self.uri = uri
        self.where = "true" if predicate is None else predicate.sql
        self.since, self.until = since, until
        self.keep = keep

    def matching(self, partition: int, start: int, end: int, limit: int) -> Matches:
        """Up to `limit` messages at or after `start` and before `end` in `partition` that the
        predicate (and `keep`) keep, in offset order, looking at SCAN_OFFSETS offsets at most."""
        if start >= end:
            return Matches([], end)
        table = delta.open_table(self.uri)
        if table is None:  # the range was committed: a table that is not there now is a fault, retried
            raise FileNotFoundError(f"the topic table {self.uri} is not there")
        end = min(end, start + SCAN_OFFSETS)
        dataset = table.to_pyarrow_dataset(
            file_pruning_predicate=f'partition = {int(partition)} AND "offset" >= {int(start)} '
                                   f'AND "offset" < {int(end)}')
        found = self._run(dataset, partition, start, end, limit)
        next_offset = found.column("offset")[-1].as_py() + 1 if limit and found.num_rows == limit else end
        if self.keep is not None and found.num_rows:
            found = found.filter(self.keep.matches(found))
        return Matches(found.to_pylist(), next_offset)

    def probe(self) -> None:
        """Bind the predicate (types, functions) against the table's columns, reading no row: the
        errors DuckDB finds only then (`key > 5`) are the caller's, refused before a replay runs."""
        self._run(TOPIC_SCHEMA.empty_table(), 0, 0, 0, 0)

    def _run(self, rows: Any, partition: int, start: int, end: int, limit: int) -> pa.Table:
        import duckdb

        # The range is the FROM's own WHERE: the predicate's WHERE can only narrow it.
        ranged = ['"partition" = $1', '"offset" >= $2', '"offset" < $3']
        args: list[int | datetime] = [partition, start, end]
        for op, at in ((">=", self.since), ("<", self.until)):
            if at is not None:
                args.append(at)
                ranged.append(f'"timestamp" {op} ${len(args)}')
        args.append(limit)
        names = ", ".join(f'"{n}"' if n != "value" else "__value AS value" for n in TOPIC_SCHEMA.names)
        con = _connect()
        try:
            con.register("rows", rows)
            con.execute(_VIEW)
            found = con.sql(f"SELECT {names} FROM (SELECT * FROM messages WHERE {' AND '.join(ranged)}) AS messages "
                            f'WHERE {self.where} ORDER BY "offset" LIMIT ${len(args)}', params=args).to_arrow_table()
        except duckdb.Error as exc:
            # The predicate's own (a type, a cast a value refuses); but DuckDB reports a failed read of
            # the table's files (the Arrow stream it scans) as invalid input too: a fault, retried.
            if type(exc).__name__ in _PREDICATE_ERRORS and _READ_FAILED not in str(exc):
                raise InvalidPredicate(f"where: {_first_line(exc)}") from None
            raise
        finally:
            con.close()
        return found.cast(TOPIC_SCHEMA)


def _first_line(exc: Exception) -> str:
    return next(iter(str(exc).strip().splitlines()), type(exc).__name__)[:500]
