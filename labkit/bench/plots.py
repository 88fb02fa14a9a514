"""Plots of the machine microbenchmarks in `labkit.bench` (matplotlib imported lazily)."""

from __future__ import annotations

from typing import Any, Sequence

from labkit.plots import axes, tidy_log_axes


def stream_sweep(results: Sequence[Any], llc_bytes: int, ax=None):
    """Best-repeat GB/s vs working set (log x) per STREAM op, last-level cache marked.

    The best repeat (STREAM's convention) because small working sets take microseconds,
    and on a shared machine one descheduled thread can inflate a typical call 100×."""
    ax = axes(ax)
    for op in dict.fromkeys(r.name for r in results):
        rows = sorted((r for r in results if r.name == op), key=lambda r: r.bytes)
        ax.plot([r.bytes / 2**20 for r in rows], [r.best_bytes_per_s / 1e9 for r in rows], "o-", ms=3, label=op)
    ax.axvline(llc_bytes / 2**20, color="k", ls="--", lw=1, label=f"last-level cache {llc_bytes / 2**20:.0f} MiB")
    ax.set_xscale("log")
    ax.set_xlabel("working set (MiB, all arrays)")
    ax.set_ylabel("bandwidth, best repeat (GB/s, reads + writes)")
    ax.set_title("STREAM: the cache → DRAM cliff")
    tidy_log_axes(ax)
    ax.legend(fontsize="small", bbox_to_anchor=(1.01, 1), loc="upper left")  # beside: the curves fill the axes
    return ax


def rate_vs(results: Sequence[Any], key: str, ax=None, xlabel: str = "", title: str = ""):
    """Achieved GFLOP/s against shape[`key`] (log-log), one line per dtype."""
    from matplotlib.ticker import NullFormatter

    ax = axes(ax)
    for dt in dict.fromkeys(r.dtype for r in results):
        rows = sorted((r for r in results if r.dtype == dt), key=lambda r: r.shape[key])
        ax.plot([r.shape[key] for r in rows], [r.flop_per_s / 1e9 for r in rows], "o-", ms=3, label=dt)
    ax.set_xscale("log")
    ax.set_yscale("log")
    tidy_log_axes(ax)
    sizes = sorted({r.shape[key] for r in results})
    ax.set_xticks(sizes, [str(v) for v in sizes])  # the measured sizes, in plain numbers
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel or key)
    ax.set_ylabel("throughput (GFLOP/s)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return ax
