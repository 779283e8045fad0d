"""What keeps the long-running processes (`serve`, its delivery process, `deliver`) small.

- pandas stays out. Nothing in these processes uses it, but pyarrow imports it, if installed,
  the first time it asks whether a value is a DataFrame (any `pa.scalar`, any filter expression,
  `pyarrow.dataset`'s own import), and that import alone weighs tens of MB of resident memory.
  Refusing it is safe: pyarrow treats the ImportError as "pandas is not installed".
- Arrow allocates from its bundled jemalloc, which returns freed pages to the kernel within
  100 ms (tables/__init__.py sets its decay), unless ARROW_DEFAULT_MEMORY_POOL chooses. The batch
  path's Arrow buffers come and go fast: from glibc's heap, shared with everything else on the
  event loop, they would leave it fragmented
  (docs/decisions/0013-native-memory-of-the-long-running-processes.md).

Only the CLI entry points call keep_small(): a test process, which imports pandas for Spark and
Airflow, must never install the refusal.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

import pyarrow as pa

REFUSED = "pandas"


class RefusePandas(importlib.abc.MetaPathFinder):
    """Answers every import of pandas with an ImportError that says why."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == REFUSED or fullname.startswith(REFUSED + "."):
            raise ImportError(f"{fullname} is kept out of this lakebroker process to save memory "
                              "(tables/process_memory.py)", name=fullname)
        return None


def keep_small() -> None:
    """Refuse pandas (unless something already imported it) and allocate Arrow memory from Arrow's
    jemalloc (unless ARROW_DEFAULT_MEMORY_POOL chooses). Idempotent."""
    if REFUSED not in sys.modules and not any(isinstance(f, RefusePandas) for f in sys.meta_path):
        sys.meta_path.insert(0, RefusePandas())
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a pyarrow built without jemalloc
            pa.set_memory_pool(pa.system_memory_pool())
