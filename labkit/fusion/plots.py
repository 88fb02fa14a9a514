"""Chapter 3 plots (matplotlib imported lazily, so labkit.fusion never needs it)."""

from __future__ import annotations

from typing import Any


def chain_bandwidth(chains: dict[str, Any], ax=None):
    """Bars: modelled GB/s of every version of every chain, with the measured read bandwidth."""
    import matplotlib.pyplot as plt

    from labkit.fusion.elementwise import CHAINS

    ax = ax or plt.subplots(figsize=(7, 3.5))[1]
    labels, values = [], []
    for chain in CHAINS:
        for r in chains[chain]["rows"]:
            labels.append(f"{chain}\n{r.version}")
            values.append(r.bytes_per_s / 1e9)
    ax.bar(range(len(values)), values, color="tab:blue")
    ax.axhline(chains["bandwidth"]["read"] / 1e9, color="tab:red", ls="--", label="measured read bandwidth")
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylabel("modelled traffic / time (GB/s)")
    ax.set_title(f"Elementwise chains, {chains['numel'] / 2**20:.0f} M fp32 elements")
    ax.legend()
    return ax


def decode_latency(rows: list, ax=None):
    """Bars: ms per decode step for each (variant, batch)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    labels = [f"{r.variant}\nbatch {r.batch}" for r in rows]
    ax.bar(range(len(rows)), [r.step_s * 1e3 for r in rows], color="tab:green")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("time per decode step (ms)")
    ax.set_title("Decode step: eager vs graph capture")
    return ax
