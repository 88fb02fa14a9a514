"""Plots for the distillation chapter (matplotlib imported lazily)."""

from __future__ import annotations

from labkit.distill.experiments import pareto_front
from labkit.plots import axes


def orders(step_rows: list[dict], ax=None):
    """Validation perplexity after every step, one line per order (log y)."""
    ax = axes(ax, (7, 4))
    by: dict[str, list[dict]] = {}
    for r in step_rows:
        by.setdefault(r["order"], []).append(r)
    for order, rs in by.items():
        ax.plot([r["step"] for r in rs], [r["ppl"] for r in rs], "o-", label=order)
        for r in rs[1:]:
            ax.annotate(r["op"].split()[0], (r["step"], r["ppl"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("validation perplexity (log scale)")
    ax.legend(fontsize=8)
    return ax


def pareto(rows: list[dict], ax=None):
    """Decode tokens/s vs validation perplexity for every variant, coloured by family
    (quantization / pruning / distillation / ...), with the Pareto front."""
    ax = axes(ax, (8, 5))
    families = list(dict.fromkeys(r["family"] for r in rows))
    for i, fam in enumerate(families):
        rs = [r for r in rows if r["family"] == fam]
        ax.scatter([r["tok_s"] for r in rs], [r["ppl"] for r in rs], color=f"C{i}", label=fam)
        for r in rs:
            ax.annotate(r["label"], (r["tok_s"], r["ppl"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = pareto_front(rows)
    ax.plot([r["tok_s"] for r in front], [r["ppl"] for r in front], "k--", lw=0.8, label="Pareto front")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("decode tokens/s, batch 1 (log scale; right is faster)")
    ax.set_ylabel("validation perplexity (log scale; lower is better)")
    ax.legend(fontsize=8)
    return ax
