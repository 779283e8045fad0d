"""What a Spark query really read: the file-scan metrics of its executed plan.

Used by the benchmark and the analyst docs' tests to show that an offset-range query on one
partition opens only the files holding that range (partition pruning + Delta data skipping on the
`offset` statistics, which ordered compaction keeps tight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class ScanMetrics:
    files_read: int
    bytes_read: int
    rows_output: int
    scans: int


def _nodes(plan: Any) -> list[Any]:
    out = []
    stack = [plan]
    while stack:
        node = stack.pop()
        name = str(node.getClass().getSimpleName())
        if name == "AdaptiveSparkPlanExec":
            stack.append(node.executedPlan())
            continue
        if name.endswith("QueryStageExec"):  # result, shuffle, broadcast and cache stages of AQE
            stack.append(node.plan())
            continue
        out.append(node)
        children = node.children()
        for i in range(children.size()):
            stack.append(children.apply(i))
    return out


def scan_metrics(frame: DataFrame) -> ScanMetrics:
    """Run the query (collect) and sum the metrics of its file scans."""
    frame.collect()
    plan = frame._jdf.queryExecution().executedPlan()
    files = size = rows = scans = 0
    for node in _nodes(plan):
        if "Scan" not in str(node.nodeName()):
            continue
        metrics = node.metrics()
        if not metrics.contains("numFiles"):
            continue
        scans += 1
        files += int(metrics.apply("numFiles").value())
        if metrics.contains("filesSize"):
            size += int(metrics.apply("filesSize").value())
        if metrics.contains("numOutputRows"):
            rows += int(metrics.apply("numOutputRows").value())
    return ScanMetrics(files_read=files, bytes_read=size, rows_output=rows, scans=scans)
