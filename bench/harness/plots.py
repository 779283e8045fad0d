"""The PNG plots of docs/benchmarks.md (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.result import REPO

IMG_DIR = REPO / "docs" / "img"  # the page's images; only `make bench` (mode full) writes here


def throughput(conns: list[int], baseline_rps: list[float], broker_rps: list[float], target_ratio: float,
               path: Path) -> None:
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, height_ratios=(3, 1.4))
    ax.plot(conns, baseline_rps, "o-", label="bare ASGI baseline (req/s)")
    ax.plot(conns, broker_rps, "s-", label="lakebroker produce, ack=wal (msg/s)")
    ax.set_xscale("log", base=2)
    ax.set_ylabel("per second")
    ax.set_title("Single-message produce against concurrency (127.0.0.1, wrk -t1)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax2.plot(conns, [b / a if a else 0.0 for a, b in zip(baseline_rps, broker_rps, strict=True)], "d-",
             color="tab:red")
    ax2.axhline(target_ratio, color="grey", linestyle="--", label=f"target {target_ratio:g}x")
    ax2.legend(fontsize=8)
    ax2.set_ylabel("ratio to baseline")
    ax2.set_xlabel("keep-alive connections")
    ax2.set_ylim(bottom=0)
    ax2.grid(True, alpha=0.3)
    ax2.set_xticks(conns, [str(c) for c in conns])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def visibility_cdf(series: list[tuple[str, list[float]]], target_p99_s: float, path: Path) -> None:
    """One CDF per (label, latencies in seconds)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, latencies in series:
        values = sorted(latencies)
        if not values:
            continue
        n = len(values)
        ax.plot([v * 1000 for v in values], [(i + 1) / n for i in range(n)], label=f"{label}, n={n}")
    ax.axvline(target_p99_s * 1000, color="grey", linestyle="--", label=f"target p99 ({target_p99_s:g} s)")
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


def webhook_cdf(latencies_ms: list[float], path: Path) -> None:
    """The produce → webhook latencies of one run, sorted, as a CDF."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(latencies_ms, [i / len(latencies_ms) for i in range(len(latencies_ms))])
    ax.set_xlabel("produce → webhook latency (ms)")
    ax.set_ylabel("fraction of messages")
    ax.set_title("Produce → webhook at 2,000 msg/s")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
