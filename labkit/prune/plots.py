"""Plots for the pruning chapter (matplotlib imported lazily)."""

from __future__ import annotations

from labkit.plots import axes, tidy_log_axes


def breakeven(sweep: dict, ax=None):
    """CSR time / dense time vs sparsity (log y), with 1 (break-even) and the bytes-only
    prediction marked."""
    ax = axes(ax, (7, 4))
    rows = sweep["rows"]
    ax.plot([100 * r["sparsity"] for r in rows], [r["csr_over_dense"] for r in rows], "o-", label="CSR / dense time")
    ax.axhline(1, color="k", lw=0.8, label="break-even")
    ax.plot([100 * r["sparsity"] for r in rows], [r["csr_MB"] / r["dense_MB"] for r in rows], "--",
            label="CSR / dense bytes (prediction from bytes)")
    if sweep["breakeven"] is not None:
        ax.axvline(100 * sweep["breakeven"], color="C3", ls=":", label=f"measured break-even {100 * sweep['breakeven']:.0f}%")
    ax.set_yscale("log")
    ax.set_xlabel("sparsity (% of weights zero)")
    ax.set_ylabel("CSR / dense (time or bytes, log scale)")
    tidy_log_axes(ax)
    ax.legend(fontsize=8)
    return ax


def decode_speed(rows: list[dict], ax=None):
    """Decode tokens/s of each pruning variant (bars), the bytes-only prediction as dots."""
    ax = axes(ax, (8, 4))
    labels = [f"{r['variant']}\n{100 * r['sparsity']:.0f}%" if r["sparsity"] else r["variant"] for r in rows]
    ref = rows[0]["tok_s"]
    ax.bar(range(len(rows)), [r["tok_s"] for r in rows], color="C0", label="measured")
    ax.plot(range(len(rows)), [ref * r["predicted_from_bytes"] for r in rows], "k_", ms=20, mew=2,
            label="predicted from bytes read")
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("decode tokens/s (batch 1)")
    ax.legend(fontsize=8)
    return ax
