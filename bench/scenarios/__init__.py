"""One module per scenario, each with a `SCENARIO` (bench/result.py); `make bench` runs them in this order."""

from __future__ import annotations

import importlib

from bench.result import Scenario

ORDER = (
    "single_produce", "batch_produce", "kafka", "flush", "produce_to_table", "profile", "big_bodies", "dedup_memory",
    "spark_jobs", "delivery", "filtered_delivery", "delivery_memory", "read_amplification", "faults", "s3", "cluster",
    "soak", "soak_cluster",
)


def scenario(name: str) -> Scenario:
    """One of ORDER by name, or any `package.module:ATTRIBUTE` that holds a Scenario."""
    if ":" in name:
        module, _, attribute = name.partition(":")
        found: Scenario = getattr(importlib.import_module(module), attribute)
        return found
    if name not in ORDER:
        raise KeyError(f"no scenario {name!r}; the scenarios are {', '.join(ORDER)}")
    found = importlib.import_module(f"bench.scenarios.{name}").SCENARIO
    return found


def every() -> list[Scenario]:
    return [scenario(name) for name in ORDER]
