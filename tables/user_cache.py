"""The per-user cache: what `lakebroker spark setup` downloads and builds for Spark (the Delta and S3A
jars, the compiled LogStores, the JVM class archive). Not under the installed package, which may be
read-only site-packages: `LAKEBROKER_CACHE_DIR`, else `$XDG_CACHE_HOME/lakebroker`, else
`~/.cache/lakebroker`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    explicit = os.environ.get("LAKEBROKER_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lakebroker"


def jars_dir() -> Path:
    return cache_dir() / "jars"


def class_archive() -> Path:
    return cache_dir() / "spark-cds.jsa"
