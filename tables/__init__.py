"""Shared layer: settings, layout, schemas, errors, topic metadata and the Delta read/write layer.

Every service imports it; it imports none of them.
"""

import os

# delta-rs allocates through its own jemalloc, which reads this variable once, at its first
# allocation: set it before anything imports deltalake (every lakebroker module reaches deltalake
# through this package). One arena and small thread caches keep jemalloc's default of 4 arenas per
# core from holding native memory from every flush commit, at the same flush speed; returning freed
# pages at once would slow large commits (docs/decisions/0013-native-memory-of-the-long-running-processes.md).
# A user's own value wins.
DELTA_RS_MALLOC_CONF = "narenas:1,tcache_max:4096"
os.environ.setdefault("_RJEM_MALLOC_CONF", DELTA_RS_MALLOC_CONF)

# serve and deliver allocate Arrow buffers from Arrow's bundled jemalloc (tables/process_memory.py),
# which reads this variable when pyarrow loads, so it too is set before anything imports pyarrow.
# Arrow's own decay of 1 s would keep a second's worth of the batch path's short-lived buffers; 100 ms
# keeps less at the same speed (docs/decisions/0013). Freed pages go back from jemalloc's background
# threads, not the event loop. A user's value wins.
ARROW_MALLOC_CONF = "dirty_decay_ms:100,muzzy_decay_ms:100"
os.environ.setdefault("JE_ARROW_MALLOC_CONF", ARROW_MALLOC_CONF)
