"""The PNG plots of docs/benchmarks.md (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.ingest import SingleResult, VisibilityRun
from bench.plan import TARGET_SINGLE_RATIO, TARGET_VISIBLE_P99_S


def throughput(single: SingleResult, path: Path) -> None:
    conns = [p.connections for p in single.points]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, height_ratios=(3, 1.4))
    ax.plot(conns, [p.baseline.rps for p in single.points], "o-", label="bare ASGI baseline (req/s)")
    ax.plot(conns, [p.broker.ok_rps for p in single.points], "s-", label="lakebroker produce, ack=wal (msg/s)")
    ax.set_xscale("log", base=2)
    ax.set_ylabel("per second")
    ax.set_title("Single-message produce against concurrency (127.0.0.1, wrk -t1)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax2.plot(conns, [p.ratio for p in single.points], "d-", color="tab:red")
    ax2.axhline(TARGET_SINGLE_RATIO, color="grey", linestyle="--", label=f"target {TARGET_SINGLE_RATIO:g}x")
    ax2.legend(fontsize=8)
    ax2.set_ylabel("ratio to baseline")
    ax2.set_xlabel("keep-alive connections")
    ax2.set_ylim(bottom=0)
    ax2.grid(True, alpha=0.3)
    ax2.set_xticks(conns, [str(c) for c in conns])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def visibility_cdf(runs: list[VisibilityRun], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        values = sorted(run.visible_s)
        if not values:
            continue
        n = len(values)
        ax.plot([v * 1000 for v in values], [(i + 1) / n for i in range(n)],
                label=f"{run.label} ({run.rate:.0f} msg/s, n={n})")
    ax.axvline(TARGET_VISIBLE_P99_S * 1000, color="grey", linestyle="--", label="target p99 (1 s)")
    ax.axhline(0.99, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("produce (ack=wal) → visible in the Delta table, ms (log scale)")
    ax.set_ylabel("fraction of messages")
    ax.set_ylim(0, 1.01)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Produce → visible in Delta: latency CDF")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
