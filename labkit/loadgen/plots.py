"""Plots of load tests (matplotlib imported lazily). Latencies on axes in s."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from labkit.loadgen.records import RequestRecord
from labkit.plots import axes, caption, tidy_log_axes


def sweep_panels(rows: Sequence[dict[str, Any]], knee: dict[str, Any] | None = None, axis: str = "concurrency",
                 axes=None, factor: float = 2.0):
    """Left: throughput (requests/s) vs the swept level; right: p50 and p99 E2E and TTFT (s,
    log) vs the level. `knee` (the ledger's, `labkit.knee.first_past`: the first level whose
    p99 E2E exceeds `factor` x the lightest level's) is starred on both, with a caption."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(12.5, 3.8))
    x = [r[axis] for r in rows]
    axes[0].plot(x, [r["throughput_rps"] for r in rows], "o-", label="completed requests/s")
    axes[0].set_ylabel("throughput (requests/s)")
    for key, style in (("e2e", "-"), ("ttft", "--")):
        for q, marker in (("p50", "o"), ("p99", "s")):
            axes[1].plot(x, [r[key][q] for r in rows], marker + style, ms=4, label=f"{q} {key.upper()}")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("latency (s, log scale)")
    base = min(rows, key=lambda r: r[axis])["e2e"]["p99"]
    axes[1].axhline(factor * base, color="0.5", ls=":", lw=1, label=f"{factor:g}x the lightest p99 E2E")
    if knee:
        axes[0].plot([knee[axis]], [knee["throughput_rps"]], "r*", ms=15, zorder=4, label=f"knee ({knee[axis]:g})")
        axes[1].plot([knee[axis]], [knee["e2e"]["p99"]], "r*", ms=15, zorder=4, label=f"knee ({knee[axis]:g})")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent users" if axis == "concurrency" else "offered rate (requests/s)")
        tidy_log_axes(ax)
        if axis == "concurrency":  # powers of two: label the levels themselves
            ax.set_xticks(x, [f"{v:g}" for v in x])
            ax.xaxis.set_minor_locator(NullLocator())
    axes[0].legend(fontsize="small", loc="upper left")
    axes[1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # six lines: beside, not over
    if knee:
        what = "users" if axis == "concurrency" else "req/s"
        caption(axes[1], f"Star: the knee as the ledger defines it (C20), the first level ({knee[axis]:g} {what}) whose "
                         f"p99 E2E passed the dotted line, {factor:g}x the lightest level's. Throughput there: "
                         f"{knee['throughput_rps']:.3g} req/s; the sweep's highest: "
                         f"{max(r['throughput_rps'] for r in rows):.3g} req/s.", width=150)
    elif rows:
        caption(axes[1], f"No knee: no level's p99 E2E passed {factor:g}x the lightest level's.", width=150)
    return axes


def latency_cdf(runs: dict[str, Sequence[RequestRecord]], key: str = "e2e_s", ax=None):
    """Empirical CDF of a per-request latency (s, log x) of completed requests, one line per run,
    with each run's mean (dashed) and p99 (dotted) marked."""
    ax = axes(ax, (7, 3.5))
    for i, (name, recs) in enumerate(runs.items()):
        x = np.sort([getattr(r, key) for r in recs if r.ok and not r.warmup and getattr(r, key) is not None])
        color = f"C{i}"
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), color=color, label=name)
        ax.axvline(float(np.mean(x)), color=color, ls="--", lw=1)
        ax.axvline(float(np.percentile(x, 99)), color=color, ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel(f"{key.removesuffix('_s').upper()} per request (s, log scale); dashed: mean, dotted: p99")
    ax.set_ylabel("fraction of requests")
    ax.legend(fontsize="small")
    tidy_log_axes(ax)
    return ax


def fidelity_bars(errors: dict[str, dict[str, float]], ax=None, band: float = 0.15):
    """Relative error (%) of the simulator per compared metric, grouped by load level; the
    ±`band` target shaded."""
    ax = axes(ax, (8, 3.5))
    levels = list(errors)
    metrics = list(next(iter(errors.values())))
    width = 0.8 / len(levels)
    for i, level in enumerate(levels):
        ax.bar(np.arange(len(metrics)) + i * width, [100 * errors[level][m] for m in metrics], width, label=level)
    ax.axhspan(-100 * band, 100 * band, color="g", alpha=0.1, label=f"±{100 * band:.0f}%")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(metrics)) + 0.4 - width / 2, metrics, fontsize="small")
    ax.set_ylabel("simulator error (%, sim / real − 1)")
    ax.legend(fontsize="small")
    return ax
