"""A columnar batch's per-message results as the JSON body the per-message path answers.

`{"results": [{"partition": p, "offset": o, "duplicate": d, "timestamp": t}, ...]}`, byte for
byte as orjson renders routes/produce.py's `_batch_results`, written into one byte array with
numpy: each result is a partition prefix, the offset's digits and a (duplicate, timestamp)
suffix. Prefixes, digit counts and suffixes are few (a group commit gives its messages one
timestamp), so results are written as rows of a byte matrix, a group of alike rows at a time,
and the matrix's used bytes, read row by row, are the body. Digits come four at a time from a
table of "0000".."9999". When every result has the same length (the usual batch: partitions of
one digit count, offsets of one digit count, no duplicates), the matrix is the body as it is.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import orjson

from lakebroker.ingest_api.chunks import BatchResults

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_OPEN = b'{"results":['
_POWERS = 10 ** np.arange(19, dtype=np.int64)  # 10**0 .. 10**18: every int64 offset's digits
_DIGITS4 = np.frombuffer(b"".join(b"%04d" % i for i in range(10_000)), np.uint32)  # "0000".."9999"


def _digits(values: np.ndarray, count: int) -> np.ndarray:
    """The last `count` decimal digits of each non-negative value, as ASCII: one row per value."""
    words = np.empty((len(values), -(-count // 4)), np.uint32)
    for word in range(words.shape[1] - 1, -1, -1):
        values, low = np.divmod(values, 10_000)
        words[:, word] = _DIGITS4[low]
    return words.view(np.uint8)[:, words.shape[1] * 4 - count :]


def batch_results_json(results: BatchResults) -> bytes:
    known = results.offset >= 0
    partitions, p_of = np.unique(results.partition, return_inverse=True)
    prefixes = [b'{"partition":%d,"offset":' % p for p in partitions.tolist()]
    stamps, t_of = np.unique(results.timestamp_us, return_inverse=True)
    times = [b"null" if t < 0 else orjson.dumps(_EPOCH + timedelta(microseconds=t)) for t in stamps.tolist()]
    suffixes = [b',"duplicate":%s,"timestamp":%s},' % (b"true" if k % 2 else b"false", times[k // 2])
                for k in range(2 * len(times))]
    offsets = np.where(known, results.offset, 0)
    digits = np.where(known, 1 + np.searchsorted(_POWERS[1:], offsets, side="right"), 0)  # 0: "null"
    s_of = t_of.ravel() * 2 + results.duplicate
    uniform = _uniform_body(prefixes, p_of.ravel(), digits, offsets, suffixes, s_of)
    if uniform is not None:
        return uniform
    # One row per result, written in groups that share a prefix, a digit count and a suffix.
    group = (p_of.ravel() * 20 + digits) * len(suffixes) + s_of
    keys, g_of = np.unique(group, return_inverse=True)
    lengths = np.empty(len(keys), np.int64)
    for g, key in enumerate(keys.tolist()):
        rest, s = divmod(key, len(suffixes))
        p, d = divmod(rest, 20)
        lengths[g] = len(prefixes[p]) + (d or 4) + len(suffixes[s])
    width = int(lengths.max())
    rows_out = np.zeros((len(group), width), np.uint8)
    for g, key in enumerate(keys.tolist()):
        rest, s = divmod(key, len(suffixes))
        p, d = divmod(rest, 20)
        rows = np.flatnonzero(g_of.ravel() == g)
        head = len(prefixes[p])
        rows_out[rows, :head] = np.frombuffer(prefixes[p], np.uint8)
        if d:
            rows_out[rows, head : head + d] = _digits(offsets[rows], d)
        else:
            rows_out[rows, head : head + 4] = np.frombuffer(b"null", np.uint8)
        tail = head + (d or 4)
        rows_out[rows, tail : tail + len(suffixes[s])] = np.frombuffer(suffixes[s], np.uint8)
    used = np.arange(width) < lengths[g_of.ravel()][:, None]
    return _OPEN + rows_out[used][:-1].tobytes() + b"]}"  # the last result's comma dropped


def _uniform_body(prefixes: list[bytes], p_of: np.ndarray, digits: np.ndarray, offsets: np.ndarray,
                  suffixes: list[bytes], s_of: np.ndarray) -> bytes | None:
    """The body, when every result has the same length (else None): each part of a result is then
    a column range of a matrix that sits inside the body's one buffer, written for all rows at
    once. (A body of 5,000 results is about 470 KB, and every fresh buffer that size costs page
    faults: this makes one, and one copy of it.)"""
    d = int(digits[0]) if len(digits) else 0
    if d == 0 or (digits != d).any() or len({len(p) for p in prefixes}) != 1:
        return None
    suffix_len = np.array([len(x) for x in suffixes])[s_of]
    if suffix_len.min() != suffix_len.max():
        return None
    head, tail = len(prefixes[0]), int(suffix_len[0])
    width = head + d + tail
    start = len(_OPEN)
    body = np.empty(start + len(offsets) * width + 1, np.uint8)
    body[:start] = np.frombuffer(_OPEN, np.uint8)
    rows = body[start : start + len(offsets) * width].reshape(len(offsets), width)
    np.take(_table(prefixes), p_of, axis=0, out=rows[:, :head])
    rows[:, head : head + d] = _digits(offsets, d)
    np.take(_table([x if len(x) == tail else b" " * tail for x in suffixes]), s_of, axis=0, out=rows[:, head + d :])
    body[-2:] = np.frombuffer(b"]}", np.uint8)  # over the last result's comma
    return body.tobytes()


def _table(parts: list[bytes]) -> np.ndarray:
    """Byte strings of one length as the rows of a matrix."""
    return np.frombuffer(b"".join(parts), np.uint8).reshape(len(parts), -1)
