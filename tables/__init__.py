"""Shared layer: settings, layout, schemas, errors, topic metadata and the Delta read/write layer.

Every service imports it; it imports none of them.
"""

import os

# delta-rs allocates through its own jemalloc, which reads this variable once, at its first
# allocation: set it before anything imports deltalake (every lakebroker module reaches deltalake
# through this package). jemalloc's default of 4 arenas per core kept native memory from every flush
# commit: serve's anonymous RSS rose 154 -> 174 MB over 2 minutes of single produce, against
# 132 -> 148 MB with one arena and small thread caches, at the same flush speed. Returning freed
# pages at once (dirty_decay_ms:0) held it at 132-135 MB but halved the flush rate of 200,000-row
# commits. docs/operations.md, "Memory". A user's own value wins.
DELTA_RS_MALLOC_CONF = "narenas:1,tcache_max:4096"
os.environ.setdefault("_RJEM_MALLOC_CONF", DELTA_RS_MALLOC_CONF)

# serve and deliver allocate Arrow buffers from Arrow's bundled jemalloc (tables/process_memory.py),
# which reads this variable when pyarrow loads, so it too is set before anything imports pyarrow.
# Arrow's own decay of 1 s kept about a second of the batch path's Arrow buffers (~100 MB/s):
# `make bench`'s batch phase peaked at 295 MB with it and 275 MB at 100 ms, at the same speed.
# Freed pages go back from jemalloc's background threads, not the event loop. A user's value wins.
ARROW_MALLOC_CONF = "dirty_decay_ms:100,muzzy_decay_ms:100"
os.environ.setdefault("JE_ARROW_MALLOC_CONF", ARROW_MALLOC_CONF)
