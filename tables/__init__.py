"""Shared layer: settings, layout, schemas, errors, topic metadata and the Delta read/write layer.

Every service imports it; it imports none of them.
"""

import os

# delta-rs allocates through its own jemalloc, which reads this variable once, at its first
# allocation: set it before anything imports deltalake (every lakebroker module reaches deltalake
# through this package). At jemalloc's defaults (8 arenas on 2 cores, freed pages kept for 10 s)
# serve's anonymous memory grew with every flush commit, 154 -> 174 MB over 2 minutes of single
# produce; with one arena, small thread caches and freed pages returned at once it stayed at
# 132-135 MB, at the same throughput (docs/operations.md, "Memory"). A user's own value wins.
DELTA_RS_MALLOC_CONF = "narenas:1,tcache_max:4096,dirty_decay_ms:0,muzzy_decay_ms:0"
os.environ.setdefault("_RJEM_MALLOC_CONF", DELTA_RS_MALLOC_CONF)
