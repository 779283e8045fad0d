"""Rows as `lakebroker sql --format` prints them: a table for people, CSV or JSON for scripts.

CSV and JSON carry every value losslessly as text: binary (such as a topic's `value`) as base64,
timestamps and dates in ISO 8601, decimals as strings, and in CSV a struct, map or array as its
JSON text and NULL as an empty field.
"""

from __future__ import annotations

import base64
import csv
from collections.abc import Sequence
from datetime import date, datetime, time
from decimal import Decimal
from enum import StrEnum
from typing import Any, TextIO

import orjson


class OutputFormat(StrEnum):
    TABLE = "table"
    CSV = "csv"
    JSON = "json"


def plain(value: Any) -> Any:
    """A JSON-ready copy of one value as pyspark returns it (Row, bytearray, datetime, Decimal ...)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if hasattr(value, "asDict"):  # pyspark.sql.Row: a struct
        return {k: plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def write_json(columns: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """One JSON array of objects, column name → value."""
    records = [{name: plain(v) for name, v in zip(columns, row, strict=True)} for row in rows]
    out.write(orjson.dumps(records).decode() + "\n")


def write_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """RFC 4180 CSV with a header row."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_cell(plain(v)) for v in row])


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return value
