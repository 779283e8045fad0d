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
