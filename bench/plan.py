"""How long and how wide each benchmark runs, per mode, and the stated targets.

`full` is `make bench`, `quick` is `make bench-quick` (under 3 minutes in all), `tiny` is the
smoke test's few-second run whose figures mean nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

# Issue 11, item 1: single produce at >= 0.5x a bare ASGI app under the same server, checked
# with `wrk -t1 -c32`: the target is judged at that concurrency, the sweep shows the rest.
TARGET_SINGLE_RATIO = 0.5
CHECK_CONNECTIONS = 32
TARGET_BATCH_MSG_S = 500_000
TARGET_KEYED_BATCH_MSG_S = 200_000
TARGET_FLUSH_ROWS_S = 1_000_000
TARGET_VISIBLE_P99_S = 1.0
TARGET_INGEST_RSS_MB = 300  # serve's peak resident memory through every benchmark above


@dataclass(frozen=True)
class Plan:
    name: str
    duration_s: float  # each closed-loop measurement
    warmup_s: float
    rounds: int  # baseline and broker alternate, in A-B then B-A order
    connections: tuple[int, ...]  # the throughput-vs-concurrency sweep
    decomposition_connections: int
    batch_bodies: tuple[tuple[str, int], ...]  # (json | ndjson [-keyed], messages per request)
    batch_connections: int
    flush_sizes: tuple[int, ...]
    flush_repeats: int
    visibility_rate: float  # messages/s of the probe
    visibility_s: float
    visibility_under_load: bool
    profile_s: float  # 0 skips the profile
    # wrk connections of the batch flood beside the probe: 32 closed loops of 1,000-message bodies
    # arrive together, the case that starved single messages (4 did not)
    flood_connections: int = 32


PLANS = {
    "full": Plan(
        name="full", duration_s=10, warmup_s=3, rounds=2, connections=(1, 4, 16, 32, 64, 128, 256),
        decomposition_connections=64, batch_bodies=(("json", 1000), ("ndjson", 1000), ("json", 5000),
                                                    ("ndjson", 5000), ("json-keyed", 1000),
                                                    ("ndjson-keyed", 5000)),
        batch_connections=4, flush_sizes=(1_000, 10_000, 100_000, 200_000), flush_repeats=3,
        visibility_rate=200, visibility_s=30, visibility_under_load=True, profile_s=10,
    ),
    "quick": Plan(
        name="quick", duration_s=2, warmup_s=1, rounds=1, connections=(1, 32, 64, 256),
        decomposition_connections=64, batch_bodies=(("json", 1000), ("ndjson", 5000), ("ndjson-keyed", 5000)),
        batch_connections=4, flush_sizes=(10_000, 100_000), flush_repeats=3,
        visibility_rate=200, visibility_s=5, visibility_under_load=True, profile_s=2,
    ),
    "tiny": Plan(
        name="tiny", duration_s=1, warmup_s=0.5, rounds=1, connections=(8,),
        decomposition_connections=8, batch_bodies=(("ndjson", 100),),
        batch_connections=2, flush_sizes=(1_000,), flush_repeats=1,
        visibility_rate=50, visibility_s=2, visibility_under_load=False, profile_s=1,
    ),
}
