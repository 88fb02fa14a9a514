"""Plotting helpers every chapter shares (matplotlib imported lazily, so importing this is cheap).

Each chapter's own plots live next to the code that produces the numbers:
`labkit.bench.plots` (STREAM / GEMM sweeps), `labkit.sim.plots`, `labkit.loadgen.plots`,
`labkit.fusion.plots`, `labkit.prune.plots`, `labkit.distill.plots`, and
`labkit.serve.cache_eval.threshold_sweep`.
"""

from __future__ import annotations

import math
import textwrap
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
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

    def plain(v: float, _pos: Any = None) -> str:
        if v <= 0 or 1e-3 <= v < 1e5:
            return f"{v:g}"
        exp = math.floor(math.log10(v) + 1e-9)
        mant = round(v / 10 ** exp, 6)
        return f"$10^{{{exp}}}$" if mant == 1 else f"${mant:g}\\times10^{{{exp}}}$"

    ax.autoscale_view()
    for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
        if scale == "log":
            lo, hi = sorted(axis.get_view_interval())
            span = hi / max(lo, 1e-300)
            # Under a decade label 1-2-3-5 steps, under two 1-2-5, so the axis keeps a few numbers.
            if span < 3:  # too narrow for any 1-2-3-5 step: evenly spaced round numbers
                axis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
                axis.set_minor_locator(NullLocator())
            else:
                subs = (1.0, 2.0, 3.0, 5.0) if span < 10 else (1.0, 2.0, 5.0) if span < 100 else (1.0,)
                axis.set_major_locator(LogLocator(subs=subs))
            axis.set_minor_formatter(NullFormatter())
            axis.set_major_formatter(FuncFormatter(plain))
    return ax


def place_labels(ax, xs, ys, texts, fontsize: float = 8, **kw: Any) -> list:
    """Label each point (xs[i], ys[i]) with texts[i], at the first of a few offsets around it
    where the label overlaps no label placed before it, no point, and stays inside the axes;
    returns the annotations. Call it after everything that sets the axis limits."""
    ax.autoscale_view()
    fig = ax.figure
    ppt = fig.dpi / 72  # pixels per point
    centres = [ax.transData.transform((x, y)) for x, y in zip(xs, ys)]
    r = 5 * ppt
    taken = [(cx - r, cy - r, cx + r, cy + r) for cx, cy in centres]
    # Lines already drawn (roofs, curves) count too, less: small boxes every few pixels along them.
    import numpy as np

    on_lines = []

    for line in ax.get_lines():
        xy = line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
        for (x0, y0), (x1, y1) in zip(xy[:-1], xy[1:]):
            if not np.isfinite([x0, y0, x1, y1]).all():
                continue
            n = int(max(abs(x1 - x0), abs(y1 - y0)) // (3 * ppt)) + 1
            for t in np.linspace(0, 1, n + 1):
                lx, ly = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
                on_lines.append((lx - ppt, ly - ppt, lx + ppt, ly + ppt))
    frame = ax.bbox
    # (dx, dy) in points from the point to the label's corner nearest it; right/left, below/above.
    offsets = [(5, -3), (5, 3), (-5, 3), (-5, -3), (5, -15), (5, 15), (-5, -15), (-5, 15),
               (12, -27), (12, 27), (-12, -27), (-12, 27), (20, -40), (20, 40), (-20, -40), (-20, 40),
               (30, -55), (30, 55), (-30, -55), (-30, 55)]
    out = []
    for x, y, (cx, cy), text in zip(xs, ys, centres, texts):
        w = 0.62 * fontsize * ppt * max(len(line) for line in str(text).splitlines() or [""])
        h = 1.3 * fontsize * ppt * max(1, len(str(text).splitlines()))
        best, best_cost = None, None
        for rank, (dx, dy) in enumerate(offsets):
            x0 = cx + dx * ppt if dx > 0 else cx + dx * ppt - w
            y0 = cy + dy * ppt if dy > 0 else cy + dy * ppt - h
            box = (x0, y0, x0 + w, y0 + h)
            def overlap(boxes):
                return sum(max(0, min(box[2], b[2]) - max(box[0], b[0])) * max(0, min(box[3], b[3]) - max(box[1], b[1]))
                           for b in boxes)

            cost = 10 * overlap(taken) + overlap(on_lines)  # covering a point or a label is worst
            outside = (max(0, frame.x0 - box[0]) + max(0, box[2] - frame.x1)) * h + \
                      (max(0, frame.y0 - box[1]) + max(0, box[3] - frame.y1)) * w
            # Outside the axes is worst; a far offset costs a little, so a label may cross a
            # line rather than drift far from its point.
            cost += 20 * outside + 15 * ppt * ppt * rank
            if best_cost is None or cost < best_cost:
                best, best_cost = (dx, dy, box), cost
        dx, dy, box = best
        taken.append(box)
        far = abs(dy) > 20  # a label pushed away from its point gets a thin line back to it
        arrow = {"arrowprops": {"arrowstyle": "-", "lw": 0.5, "color": "0.5", "shrinkA": 0, "shrinkB": 3}} if far else {}
        out.append(ax.annotate(text, (x, y), xycoords="data", fontsize=fontsize, textcoords="offset points",
                               xytext=(dx, dy), ha="left" if dx > 0 else "right",
                               va="bottom" if dy > 0 else "top", **arrow, **kw))
    return out


def caption(ax, text: str, width: int = 110) -> Any:
    """Put `text` under the figure of `ax` as a caption (wrapped at `width` characters); returns `ax`.
    The inline backend saves with a tight bounding box, so the caption is kept."""
    fig = ax.figure
    fig.text(0.01, -0.01, textwrap.fill(text, width), ha="left", va="top", fontsize="small", color="0.25")
    return ax
