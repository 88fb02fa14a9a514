"""Chapter 3 plots (matplotlib imported lazily, so labkit.fusion never needs it)."""

from __future__ import annotations


from labkit.plots import axes


def chain_bandwidth(chains: dict[str, dict[str, float]], numel: int, read_bw: float, ax=None):
    """Bars: modelled GB/s (traffic model bytes / measured time) of each chain eager and fused,
    from `labkit.fusion.experiments.measure_c7` (`chains`) at `numel` fp32 elements, with the measured
    read bandwidth `read_bw` (B/s) as a line."""
    from labkit.fusion.elementwise import traffic_bytes

    ax = axes(ax, (7, 3.5))
    labels, values = [], []
    for chain, m in chains.items():
        for version in ("eager", "fused"):
            labels.append(f"{chain}\n{version}")
            values.append(traffic_bytes(chain, version, numel) / m[f"{version}_s"] / 1e9)
    ax.bar(range(len(values)), values, color="tab:blue")
    ax.axhline(read_bw / 1e9, color="tab:red", ls="--", label="measured read bandwidth")
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylabel("modelled traffic / time (GB/s)")
    ax.set_title(f"Elementwise chains, {numel / 2**20:.0f} M fp32 elements")
    ax.legend()
    return ax


def decode_latency(rows: list, ax=None):
    """Bars: ms per decode step for each (variant, batch)."""
    ax = axes(ax, (6, 3.5))
    labels = [f"{r.variant}\nbatch {r.batch}" for r in rows]
    ax.bar(range(len(rows)), [r.step_s * 1e3 for r in rows], color="tab:green")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("time per decode step (ms)")
    ax.set_title("Decode step: eager vs graph capture")
    return ax
