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
