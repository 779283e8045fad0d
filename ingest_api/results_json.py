"""A columnar batch's per-message results as the JSON body the per-message path answers.

`{"results": [{"partition": p, "offset": o, "duplicate": d, "timestamp": t}, ...]}`, byte for
byte as orjson renders routes/produce.py's `_batch_results`, written into one byte array with
numpy: each result is a partition prefix, the offset's digits and a (duplicate, timestamp)
suffix. Prefixes, digit counts and suffixes are few (a group commit gives its messages one
timestamp), so results are written as rows of a byte matrix, a group of alike rows at a time,
and the matrix's used bytes, read row by row, are the body.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import orjson

from ingest_api.chunks import BatchResults

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_POWERS = 10 ** np.arange(19, dtype=np.int64)  # 10**0 .. 10**18: every int64 offset's digits


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
    # One row per result, written in groups that share a prefix, a digit count and a suffix.
    group = (p_of.ravel() * 20 + digits) * len(suffixes) + t_of.ravel() * 2 + results.duplicate
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
            rows_out[rows, head : head + d] = offsets[rows, None] // _POWERS[d - 1 :: -1] % 10 + 48
        else:
            rows_out[rows, head : head + 4] = np.frombuffer(b"null", np.uint8)
        tail = head + (d or 4)
        rows_out[rows, tail : tail + len(suffixes[s])] = np.frombuffer(suffixes[s], np.uint8)
    used = np.arange(width) < lengths[g_of.ravel()][:, None]
    return b'{"results":[' + rows_out[used][:-1].tobytes() + b"]}"  # the last result's comma dropped
