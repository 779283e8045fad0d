"""How keys, values and headers given to send() become a message of the produce API.

Kafka clients take keys and values as bytes, with optional serializers. The broker keeps a key
as a UTF-8 string (its murmur2 is taken over those bytes, so a key lands where a Kafka client
puts it) and a value in one of three formats: bytes → binary, str → text, and, as lakebroker's
own convenience, anything else JSON-serialisable → json.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Serializer = Callable[[Any], Any]  # returns bytes or str (or None for a value: a tombstone)
Deserializer = Callable[[bytes], Any]
Headers = Mapping[str, str] | Iterable[tuple[str, str | bytes]]


def _text(data: str | bytes | bytearray | memoryview, what: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} must be UTF-8: the broker keeps it as a string") from None


def key_field(key: Any, serializer: Serializer | None) -> str | None:
    if serializer is not None and key is not None:
        key = serializer(key)
    if key is None:
        return None
    if not isinstance(key, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"key must be str or bytes (or give a key_serializer), not {type(key).__name__}")
    return _text(key, "a key")


def value_fields(value: Any, serializer: Serializer | None) -> dict[str, Any]:
    if serializer is not None and value is not None:
        value = serializer(value)
        if value is not None and not isinstance(value, (str, bytes, bytearray, memoryview)):
            raise TypeError(f"value_serializer must return bytes or str, not {type(value).__name__}")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"value_b64": base64.b64encode(value).decode()}
    return {"value": value}


def headers_field(headers: Headers | None) -> dict[str, str] | None:
    """Kafka-style [(name, bytes)] pairs or a str → str mapping; the broker keeps a string map."""
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in pairs:
        if not isinstance(name, str) or not isinstance(value, (str, bytes, bytearray, memoryview)):
            raise TypeError("headers must be str names with str or bytes values")
        if name in out:
            raise ValueError(f"header {name!r} given twice: the broker keeps headers as a map")
        out[name] = _text(value, f"header {name!r}")
    return out
