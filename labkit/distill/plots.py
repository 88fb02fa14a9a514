"""Plots for the distillation chapter (matplotlib imported lazily)."""

from __future__ import annotations

from labkit.distill.experiments import pareto_front
from labkit.plots import axes, place_labels, tidy_log_axes


def orders(step_rows: list[dict], ax=None):
    """Validation perplexity after every step, one line per order (log y)."""
    ax = axes(ax, (7, 4))
    by: dict[str, list[dict]] = {}
    for r in step_rows:
        by.setdefault(r["order"], []).append(r)
    px, py, texts = [], [], []
    n = len(by)
    for i, (order, rs) in enumerate(by.items()):
        # Orders that reach the same perplexity would hide each other's lines: shift each a
        # little sideways and give it its own marker.
        dx = (i - (n - 1) / 2) * 0.08
        ax.plot([r["step"] + dx for r in rs], [r["ppl"] for r in rs], marker="os^Dv"[i % 5], ls="-",
                alpha=0.85, label=order)
        for r in rs[1:]:
            px.append(r["step"] + dx), py.append(r["ppl"]), texts.append(r["op"].split()[0])
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("validation perplexity (log scale)")
    ax.set_xticks(sorted({r["step"] for r in step_rows}))
    tidy_log_axes(ax)
    place_labels(ax, px, py, texts, fontsize=7)
    ax.legend(fontsize=8, loc="best")
    return ax


def pareto(rows: list[dict], ax=None):
    """Decode tokens/s vs validation perplexity for every variant, coloured by family
    (quantization / pruning / distillation / ...), with the Pareto front."""
    ax = axes(ax, (8, 5))
    families = list(dict.fromkeys(r["family"] for r in rows))
    for i, fam in enumerate(families):
        rs = [r for r in rows if r["family"] == fam]
        ax.scatter([r["tok_s"] for r in rs], [r["ppl"] for r in rs], color=f"C{i}", label=fam)
    front = pareto_front(rows)
    ax.plot([r["tok_s"] for r in front], [r["ppl"] for r in front], "k--", lw=0.8, label="Pareto front")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("decode tokens/s, batch 1 (log scale; right is faster)")
    ax.set_ylabel("validation perplexity (log scale; lower is better)")
    tidy_log_axes(ax)
    place_labels(ax, [r["tok_s"] for r in rows], [r["ppl"] for r in rows], [r["label"] for r in rows], fontsize=7)
    ax.legend(fontsize=8, loc="best")
    return ax
