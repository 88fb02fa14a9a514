"""Plotting helpers every chapter shares (matplotlib imported lazily, so importing this is cheap).

Each chapter's own plots live next to the code that produces the numbers:
`labkit.bench.plots` (STREAM / GEMM sweeps), `labkit.sim.plots`, `labkit.loadgen.plots`,
`labkit.fusion.plots`, `labkit.prune.plots`, `labkit.distill.plots`, and
`labkit.serve.cache_bench.threshold_sweep`.
"""

from __future__ import annotations

from typing import Any


def axes(ax: Any = None, size: tuple[float, float] = (7, 4)) -> Any:
    """`ax` if given, else the axes of a new figure of `size` (inches): every plot function
    takes an optional `ax` so a notebook can put several plots on one figure."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=size)[1]


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
