"""Plots of benchmark results shared by the chapters (matplotlib imported lazily)."""

from __future__ import annotations

from typing import Any, Sequence


def _axes(ax, size=(7, 4)):
    import matplotlib.pyplot as plt

    return ax or plt.subplots(figsize=size)[1]


def tidy_log_axes(ax) -> Any:
    """Drop the minor tick labels matplotlib prints on short log axes ("4x10^1, 3x10^1, ..."),
    keeping the major decades and plain numbers for them; returns `ax`."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
        if scale == "log":
            lo, hi = sorted(axis.get_view_interval())
            # Under two decades, label 1-2-5 steps so the axis still has a few numbers on it.
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if hi / max(lo, 1e-300) < 100 else (1.0,)))
            axis.set_minor_formatter(NullFormatter())
            axis.set_major_formatter(plain)
    return ax


def caption(ax, text: str, width: int = 110) -> Any:
    """Put `text` under the figure of `ax` as a caption (wrapped at `width` characters); returns `ax`.
    The inline backend saves with a tight bounding box, so the caption is kept."""
    import textwrap

    fig = ax.figure
    fig.text(0.01, -0.01, textwrap.fill(text, width), ha="left", va="top", fontsize="small", color="0.25")
    return ax


def stream_sweep(results: Sequence[Any], llc_bytes: int, ax=None):
    """Best-repeat GB/s vs working set (log x) per STREAM op, last-level cache marked.

    The best repeat (STREAM's convention) because small working sets take microseconds,
    and on a shared machine one descheduled thread can inflate a typical call 100×."""
    ax = _axes(ax)
    for op in dict.fromkeys(r.name for r in results):
        rows = sorted((r for r in results if r.name == op), key=lambda r: r.bytes)
        ax.plot([r.bytes / 2**20 for r in rows], [r.best_bytes_per_s / 1e9 for r in rows], "o-", ms=3, label=op)
    ax.axvline(llc_bytes / 2**20, color="k", ls="--", lw=1, label=f"last-level cache {llc_bytes / 2**20:.0f} MiB")
    ax.set_xscale("log")
    ax.set_xlabel("working set (MiB, all arrays)")
    ax.set_ylabel("bandwidth, best repeat (GB/s, reads + writes)")
    ax.set_title("STREAM: the cache → DRAM cliff")
    ax.legend(fontsize="small")
    return ax


def rate_vs(results: Sequence[Any], key: str, ax=None, xlabel: str = "", title: str = ""):
    """Achieved GFLOP/s against shape[`key`] (log-log), one line per dtype."""
    ax = _axes(ax)
    for dt in dict.fromkeys(r.dtype for r in results):
        rows = sorted((r for r in results if r.dtype == dt), key=lambda r: r.shape[key])
        ax.plot([r.shape[key] for r in rows], [r.flop_per_s / 1e9 for r in rows], "o-", ms=3, label=dt)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel or key)
    ax.set_ylabel("throughput (GFLOP/s)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return ax


def threshold_sweep(curves: dict[str, Sequence[dict]], target: float = 0.99, default: float | None = None, axes=None):
    """Two panels against the similarity threshold, one colour per curve. Top: the share of hits
    that are wrong (100 - hit precision, %, symlog so 1% and 2% stand apart from 50%), with the
    target as a dotted line (below it: precision >= `target`); bottom: hit rate (% of
    same-meaning pairs that hit). `curves`: name -> rows with "threshold", "precision",
    "hit_rate" and "hits" (thresholds where nothing hits have no precision and are left out).
    An optional `default` threshold is a grey vertical line. Returns the two axes."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top, bottom = axes
    for i, (name, rows) in enumerate(curves.items()):
        rows = sorted(rows, key=lambda r: r["threshold"])
        hit = [r for r in rows if r["hits"]]
        top.plot([r["threshold"] for r in hit], [100 * (1 - r["precision"]) for r in hit], color=f"C{i}", lw=2,
                 label=name)
        bottom.plot([r["threshold"] for r in rows], [100 * r["hit_rate"] for r in rows], color=f"C{i}", lw=2,
                    label=name)
    top.axhline(100 * (1 - target), color="k", ls=":", lw=1.2,
                label=f"{100 * (1 - target):g}% wrong = {100 * target:g}% precision")
    top.set_yscale("symlog", linthresh=1.0)
    top.set_ylim(0, 100)
    top.set_yticks([0, 0.5, 1, 2, 5, 10, 20, 50, 100], ["0", "0.5", "1", "2", "5", "10", "20", "50", "100"])
    top.set_ylabel("wrong hits\n(% of hits)")
    bottom.set_ylabel("hit rate (% of\nsame-meaning pairs)")
    bottom.set_ylim(0, 102)
    bottom.set_xlabel("cosine similarity threshold (a hit needs at least this)")
    for ax in axes:
        if default is not None:
            ax.axvline(default, color="0.6", lw=1, label=f"common default {default:g}")
        ax.grid(alpha=0.3)
    top.legend(fontsize="small", loc="lower left")
    return axes
