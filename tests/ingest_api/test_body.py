"""The produce hot path checks messages by hand (ingest_api/body.py); /docs documents them with
`schemas.MessageIn`. These cases hold the two to the same answer: accepted with the same
fields, or refused."""

from __future__ import annotations

import tracemalloc
from typing import Any

import orjson
import pytest
from pydantic import TypeAdapter, ValidationError

from lakebroker.ingest_api.body import batch_items, fast_batch_items, message_from_json, parse_batch, parse_message
from lakebroker.ingest_api.schemas import MAX_INT, MessageIn
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.message_format import from_base64, from_json_value

_MODEL = TypeAdapter(MessageIn)

CASES: list[Any] = [
    # the two shapes message_from_json answers first, and their neighbours
    {"value": "hello"},
    {"key": "user-1", "value": "hello"},
    {"key": "user-1", "value": {"event": "order", "amount": 42.5, "items": [1, None]}},
    {"key": "", "value": "x"},
    {"key": None, "value": "x"},
    {"key": "k" * (64 * 1024), "value": 7},
    {"key": "k" * (64 * 1024 + 1), "value": "x"},
    {"key": 5, "value": "x"},
    {"key": "k", "value": None},
    {"value": [1, "two", {"three": 3.0}]},
    {"id": "x", "value": "v"},
    {"value": None},
    {"value": {"a": [1, 2.5, None]}, "key": "user-7", "headers": {"h": "v"}},
    {"value": 1, "partition": 0},
    {"value": 1, "partition": 1023},
    {"value": 1, "partition": 5.0},
    {"value": 1, "partition": True},
    {"value": 1, "partition": "1"},
    {"value": 1, "partition": -1},
    {"value": 1, "sequence": MAX_INT, "producer_id": "p"},
    {"value": 1, "sequence": MAX_INT + 1, "producer_id": "p"},
    {"value": 1, "id": ""},
    {"value": 1, "id": "x" * 256},
    {"value": 1, "id": "x" * 257},
    {"value": 1, "key": ""},
    {"value": 1, "key": "k" * (64 * 1024 + 1)},
    {"value": 1, "key": 5},
    {"value": 1, "headers": {"h": 1}},
    {"value": 1, "headers": ["h"]},
    {"value_b64": "aGk="},
    {"value_b64": "aGk=", "value": None},
    {"value_b64": "aGk=", "value": 1},
    {"value_b64": None},
    {"value_b64": 5},
    {"key": "k"},
    {"value": 1, "bogus": 2},
    [{"value": 1}],
    "value",
]


def _model_answer(case: Any) -> tuple[Any, ...] | None:
    try:
        m = _MODEL.validate_json(orjson.dumps(case))
    except ValidationError:
        return None
    value, fmt = (from_base64(m.value_b64), "binary") if m.value_b64 is not None else from_json_value(m.value)
    return value, fmt, m.key, m.headers, m.partition, m.id, m.producer_id, m.sequence


def _fast_answer(case: Any) -> tuple[Any, ...] | None:
    try:
        n = message_from_json(case)
    except LakebrokerError as exc:
        assert 400 <= exc.status < 500
        return None
    return n.value, n.format, n.key, n.headers, n.partition, n.message_id, n.producer_id, n.sequence


@pytest.mark.parametrize("case", CASES, ids=[orjson.dumps(c)[:40].decode() for c in CASES])
def test_the_hand_check_agrees_with_the_documented_model(case: Any) -> None:
    assert _fast_answer(case) == _model_answer(case)


def test_integers_beyond_64_bits_stay_exact_or_are_refused() -> None:
    """A float-based parser would store 123456789012345678901234567890 as 1.2345678901234568e+29."""
    with pytest.raises(LakebrokerError) as refused:
        parse_message("application/json", {}, b'{"value": 123456789012345678901234567890}')
    assert refused.value.status == 400
    for token in (b"NaN", b"Infinity", b"1e400"):
        with pytest.raises(LakebrokerError) as bad:
            parse_message("application/json", {}, b'{"value": ' + token + b"}")
        assert bad.value.status == 400


BIG = b"123456789012345678901234567890"  # orjson reads it as a float


@pytest.mark.parametrize("kind, body", [
    ("application/json", b'{"messages": [{"value": "a"}, {"value": "b", "partition": ' + BIG + b"}]}"),
    ("application/json", b'{"messages": [{"value": {"n": ' + BIG + b"}}]}"),
    ("application/x-ndjson", b'{"value": "a"}\n{"value": [-' + BIG + b"]}\n"),
    ("application/json", b'{"messages": [{"value": "a"}, {"value": 1e400}]}'),  # jiter reads inf, orjson refuses
    ("application/json", b'{"messages": [{"value": "a"}, {"value": "b",]}'),
    ("application/x-ndjson", b'{"value": "a"}\n{"value": \n'),
    ("application/json", b'{"messages": [{"value": "a", "key": "k", "partition": 2, "id": "i"}, {"value": null}]}'),
    ("application/x-ndjson", '{"value": "ü\\u00e9"}\n\n{"key": "k", "value": [1, 2.5, {"a": null}]}\n'.encode()),
])
def test_the_orjson_parse_answers_as_the_exact_one(kind: str, body: bytes) -> None:
    """The columnar path parses with orjson; whatever it cannot take goes per message, parsed again
    exactly, so the messages, or the error, are jiter's."""
    def answer(parse: Any) -> Any:
        try:
            return [m.__dict__ if hasattr(m, "__dict__") else m for m in parse(kind, body).messages()]
        except LakebrokerError as exc:
            return exc.status, str(exc)

    exact = answer(batch_items)
    assert answer(fast_batch_items) == exact
    if BIG in body:  # the exact parse kept the integer: a float would have been stored, not refused
        assert exact[0] in (400, 422) and "e+29" not in exact[1]


def test_batch_errors_name_the_message() -> None:
    with pytest.raises(LakebrokerError, match="message 1: unknown fields bogus"):
        parse_batch("application/json", b'{"messages": [{"value": 1}, {"value": 2, "bogus": 3}]}')
    with pytest.raises(LakebrokerError, match="on line 2"):
        parse_batch("application/x-ndjson", b'{"value": 1}\n{"value": 2, "bogus": 3}\n')
    with pytest.raises(LakebrokerError, match="1 to 100000"):
        parse_batch("application/json", b'{"messages": []}')


@pytest.mark.parametrize("parse", [fast_batch_items, batch_items])
def test_a_body_of_newlines_is_refused_without_a_list_of_its_lines(parse: Any) -> None:
    """8 MiB of newlines once became a list of 8M empty lines (64 MB of pointers, and a second one
    on the fallback path) before its 400; the lines are now counted in C first."""
    body = b"\n" * (8 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(LakebrokerError, match="at most 200000 lines"):
            parse("application/x-ndjson", body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated to refuse it"


def test_blank_lines_between_messages_are_still_allowed() -> None:
    body = b'{"value": 1}\n\n \r\n{"value": 2}\r\n\n'
    assert [m.value for m in batch_items("application/x-ndjson", body).messages()] == [b"1", b"2"]
    assert [m.value for m in fast_batch_items("application/x-ndjson", body).messages()] == [b"1", b"2"]
