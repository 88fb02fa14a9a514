"""Plots for chapter 5 (matplotlib imported lazily). Times on axes in s or ms, as labelled."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from labkit.plots import axes, caption, place_labels, tidy_log_axes
from labkit.sim import metrics
from labkit.sim.result import Result

# Distinct line styles and markers, so curves that coincide stay visible (a dashed line over a solid one).
_STYLES = [dict(ls="-", lw=3.0, alpha=0.55), dict(ls="--", lw=1.6, marker="o"), dict(ls=":", lw=2.0, marker="s"),
           dict(ls="-.", lw=1.6, marker="^"), dict(ls=(0, (5, 1, 1, 1)), lw=1.6, marker="D")]


def latency_cdf(results: dict[str, Result], key: str = "e2e", ax=None, same_within: float = 0.02):
    """Empirical CDF of a per-request latency (s, log x) for each named result.

    Each curve has its own line style and marker. Where two curves coincide (p50 and p99 within
    `same_within`, relative), the first is drawn wide and pale underneath, the later one thin and
    dashed on top, and the legend says "(on top of ...)"; the legend sits outside the axes."""
    ax = axes(ax, (7, 3.5))
    curves = {}
    for name, res in results.items():
        x = np.sort(metrics.per_request(res)[key][res.done])
        curves[name] = x[~np.isnan(x)]
    q = {k: (np.percentile(x, 50), np.percentile(x, 99)) for k, x in curves.items() if len(x)}
    names = list(q)
    twin_of = {}
    for j, b in enumerate(names):
        a = next((a for a in names[:j] if all(abs(u / v - 1) <= same_within for u, v in zip(q[b], q[a]))), None)
        if a:
            twin_of[b] = a
    for i, name in enumerate(names):
        x = curves[name]
        style = dict(_STYLES[i % len(_STYLES)])
        if name in twin_of.values():    # something lies on top of it: wide and pale underneath
            style = dict(ls="-", lw=5.0, alpha=0.4)
        elif name in twin_of:           # thin and dashed on top, markers shifted from the one below
            style = dict(ls="--", lw=1.3, marker="o")
        if "marker" in style:
            step = max(1, len(x) // 8)
            style.update(ms=4, mfc="none", markevery=(int(step * (i % 3) / 3), step))
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), color=f"C{i}", zorder=2 + i,
                label=name + (f" (on top of {twin_of[name]})" if name in twin_of else ""), **style)
    ax.set_xscale("log")
    ax.set_xlabel(f"{key.upper()} per request (s, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    tidy_log_axes(ax)
    return ax


def timeline(res: Result, ax=None, window: tuple[float, float] | None = None):
    """Running batch size and KV utilisation (%) over simulated time (s)."""
    ax = axes(ax, (7, 3.5))
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


def sweep_curve(rows: Sequence[dict[str, Any]], knee: dict | None = None, ax=None, comfort: dict | None = None,
                factor: float = 2.0):
    """Throughput (req/s) against p99 E2E latency (s, log), one point per offered rate (labels).

    `knee`: the ledger's knee (`labkit.knee.first_past`: the first rate whose p99 E2E exceeds
    `factor` x the lightest rate's), a star; `comfort` (optional): the last rate still inside the
    bound (`labkit.knee.last_inside`), a diamond. A caption under the plot says which is which."""
    ax = axes(ax, (7, 3.5))
    x = [r["throughput_rps"] for r in rows]
    y = [r["e2e"]["p99"] for r in rows]
    ax.plot(x, y, "o-", label="load sweep", zorder=2)
    base = min(rows, key=lambda r: r["rate"])["e2e"]["p99"]
    ax.axhline(factor * base, color="0.5", ls=":", lw=1, label=f"{factor:g}x the lightest rate's p99")
    text = []
    if comfort:
        ax.plot([comfort["throughput_rps"]], [comfort["e2e"]["p99"]], "D", color="C2", ms=8, zorder=3,
                label="last comfortable rate")
        text.append(f"Diamond: the last offered rate ({comfort['rate']:.3g} req/s) that kept throughput >= 90% of the "
                    f"offered rate and p99 within {factor:g}x the lightest.")
    if knee:
        ax.plot([knee["throughput_rps"]], [knee["e2e"]["p99"]], "r*", ms=15, zorder=4, label="knee (ledger)")
        text.append(f"Star: the knee as the ledger defines it, the first offered rate ({knee['rate']:.3g} req/s) whose "
                    f"p99 E2E passed the dotted line ({factor:g}x the lightest rate's). Throughput there: "
                    f"{knee['throughput_rps']:.3g} req/s; the sweep's highest: {max(x):.3g} req/s.")
    ax.set_yscale("log")
    ax.set_xlabel("throughput (requests/s); labels: offered rate (req/s)")
    ax.set_ylabel("p99 E2E latency (s, log scale)")
    ax.legend(fontsize="small")
    tidy_log_axes(ax)
    place_labels(ax, x, y, [f"{r['rate']:.3g}" for r in rows], fontsize=7)  # bunched points at the top stay legible
    if text:
        caption(ax, " ".join(text))
    return ax
