"""Plots for chapter 5 (matplotlib imported lazily). Times on axes in s or ms, as labelled."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from labkit.sim import metrics
from labkit.sim.result import Result


def _ax(ax, size=(7, 3.5)):
    import matplotlib.pyplot as plt

    return ax or plt.subplots(figsize=size)[1]


def latency_cdf(results: dict[str, Result], key: str = "e2e", ax=None):
    """Empirical CDF of a per-request latency (s, log x) for each named result."""
    ax = _ax(ax)
    for name, res in results.items():
        x = np.sort(metrics.per_request(res)[key][res.done])
        x = x[~np.isnan(x)]
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=name)
    ax.set_xscale("log")
    ax.set_xlabel(f"{key.upper()} per request (s, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.legend(fontsize="small")
    return ax


def timeline(res: Result, ax=None, window: tuple[float, float] | None = None):
    """Running batch size and KV utilisation (%) over simulated time (s)."""
    ax = _ax(ax)
    tl = res.timeline
    keep = slice(None) if window is None else (tl["t"] >= window[0]) & (tl["t"] <= window[1])
    ax.step(tl["t"][keep], tl["batch"][keep], where="post", label="running sequences")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("running sequences")
    ax2 = ax.twinx()
    ax2.plot(tl["t"][keep], 100 * tl["kv_blocks"][keep] / res.kv_total, color="C1", label="KV in use")
    ax2.set_ylabel("KV memory in use (%)")
    ax.legend(loc="upper left", fontsize="small")
    ax2.legend(loc="upper right", fontsize="small")
    return ax


def sweep_curve(rows: Sequence[dict[str, Any]], knee: dict | None = None, ax=None):
    """Throughput (req/s) against p99 E2E latency (s), one point per offered rate; knee marked."""
    ax = _ax(ax)
    x = [r["throughput_rps"] for r in rows]
    y = [r["e2e"]["p99"] for r in rows]
    ax.plot(x, y, "o-", label="load sweep")
    for r in rows:
        ax.annotate(f"{r['rate']:.3g}", (r["throughput_rps"], r["e2e"]["p99"]), fontsize=7)
    if knee:
        ax.plot([knee["throughput_rps"]], [knee["e2e"]["p99"]], "r*", ms=14, label="knee")
    ax.set_yscale("log")
    ax.set_xlabel("throughput (requests/s); labels: offered rate")
    ax.set_ylabel("p99 E2E latency (s, log scale)")
    ax.legend(fontsize="small")
    return ax
