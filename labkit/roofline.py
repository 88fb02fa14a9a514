"""The roofline model: ceilings, ridge point, attainable performance, verdicts, plots,
and an analytic per-layer roofline of a decoder-only transformer.

Units throughout: FLOP/s for compute peaks, bytes/s for bandwidth, FLOP/byte for
arithmetic intensity, seconds for time.

    attainable(I) = min(peak, I · bandwidth)        ridge = peak / bandwidth

A kernel whose intensity is below the ridge is memory-bound (C4): more FLOP/s would not
help it, more bandwidth would.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from labkit import dtypes
from labkit.paths import DATA
from labkit.plots import axes, caption, place_labels, tidy_log_axes

HARDWARE_CSV = DATA / "hardware.csv"
DTYPE_COLUMNS = {"fp32": "fp32_tflops", "tf32": "tf32_tflops", "bf16": "bf16_tflops",
                 "fp16": "fp16_tflops", "int8": "int8_tops"}


# ------------------------------------------------------------------------------ ceilings


@dataclasses.dataclass(frozen=True)
class Roofline:
    """Compute peaks per dtype (FLOP/s) and one memory bandwidth (bytes/s)."""

    name: str
    peaks: dict[str, float]
    bandwidth: float
    source: str = ""
    memory_bytes: float | None = None

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        bad = {k: v for k, v in self.peaks.items() if not v > 0}
        if not self.peaks or bad:
            raise ValueError(f"peaks must be a non-empty dict of FLOP/s > 0, got {self.peaks!r}")

    def peak(self, dtype: str = "fp32") -> float:
        """Compute peak in FLOP/s for `dtype`."""
        if dtype not in self.peaks:
            raise ValueError(f"{self.name} has no {dtype!r} peak; available: {', '.join(self.peaks)}")
        return self.peaks[dtype]

    def ridge(self, dtype: str = "fp32") -> float:
        """Ridge point in FLOP/byte: the intensity where the bandwidth slope meets the peak."""
        return self.peak(dtype) / self.bandwidth

    def attainable(self, intensity: float, dtype: str = "fp32") -> float:
        """Best FLOP/s a kernel of `intensity` FLOP/byte can reach: min(peak, I · bandwidth)."""
        if not intensity >= 0:
            raise ValueError(f"intensity must be >= 0 FLOP/byte, got {intensity!r}")
        return min(self.peak(dtype), intensity * self.bandwidth)

    def bound(self, intensity: float, dtype: str = "fp32") -> str:
        """'memory' below the ridge point, 'compute' at or above it."""
        return "memory" if intensity < self.ridge(dtype) else "compute"

    def time(self, flops: float, nbytes: float, dtype: str = "fp32") -> float:
        """Roofline lower bound on time in s: max(FLOPs / peak, bytes / bandwidth)."""
        return max(flops / self.peak(dtype), nbytes / self.bandwidth)

    @classmethod
    def from_hardware(cls, row: "str | dict[str, str]") -> "Roofline":
        """Roofline of a datasheet row (a dict from `hardware_table()` or a name)."""
        row = hardware(row) if isinstance(row, str) else row
        peaks = {dt: float(row[col]) * 1e12 for dt, col in DTYPE_COLUMNS.items() if row.get(col)}
        mem = float(row["memory_gb"]) * 1e9 if row.get("memory_gb") else None
        return cls(row["name"], peaks, float(row["bandwidth_gbps"]) * 1e9,
                   f"datasheet: {row['source']}", mem)

    @classmethod
    def from_report(cls, report: Any, dram_multiple: float = 2.0) -> "Roofline":
        """Measured ceilings from a `labkit.bench.Report`.

        Peak per dtype = the best matmul FLOP/s of that dtype; bandwidth = the best STREAM
        rate over working sets >= `dram_multiple` × the last-level cache (so a cache hit
        can't pass for DRAM bandwidth). Both from the fastest repeat, as STREAM does: a
        ceiling is what the machine delivered at its best, not on a typical call.
        """
        llc = report.fingerprint["llc_bytes"]
        peaks: dict[str, float] = {}
        for r in report.results:
            if r.name == "gemm":
                peaks[r.dtype] = max(peaks.get(r.dtype, 0.0), r.best_flop_per_s)
        bws = [r.best_bytes_per_s for r in report.results
               if r.group == "stream" and r.bytes >= dram_multiple * llc]
        if not peaks or not bws:
            raise ValueError("the report needs gemm rows and STREAM rows at DRAM sizes "
                             f"(>= {dram_multiple} x LLC = {dram_multiple * llc / 2**20:.0f} MiB)")
        fp = report.fingerprint
        return cls(f"{fp['device_name']} (measured)", peaks, max(bws),
                   f"measured {fp['date']}, torch {fp['torch_version']}, {fp['torch_threads']} threads",
                   fp.get("memory_bytes"))


def hardware_table(path: Path = HARDWARE_CSV) -> list[dict[str, str]]:
    """Every datasheet row of data/hardware.csv as a dict of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def hardware(name: str, path: Path = HARDWARE_CSV) -> dict[str, str]:
    """The row named `name` (exact, case-insensitive) or whose alias appears as a whole
    word in `name` (e.g. a `describe().name`); ValueError listing the known rows if none."""
    row = lookup(name, path)
    if row is None:
        raise ValueError(f"no hardware row matches {name!r}; known: "
                         f"{', '.join(r['name'] for r in hardware_table(path))}")
    return row


def lookup(device_name: str, path: Path = HARDWARE_CSV) -> dict[str, str] | None:
    """Like `hardware()` but returns None for unknown devices (use measured ceilings then)."""
    rows = hardware_table(path)
    key = device_name.strip().lower()
    for r in rows:
        if r["name"].lower() == key:
            return r
    for r in rows:
        for alias in filter(None, r["aliases"].split(";")):
            if re.search(rf"(?<![\w-]){re.escape(alias.strip())}(?![\w])", key):
                return r
    return None


def for_device(device_name: str, report: Any = None) -> Roofline:
    """The datasheet roofline of `device_name` if it has a row, else the measured one."""
    row = lookup(device_name)
    if row is not None:
        return Roofline.from_hardware(row)
    if report is None:
        raise ValueError(f"{device_name!r} has no datasheet row and no measured report was given")
    return Roofline.from_report(report)


def c3_pairs(rows: Sequence[dict[str, str]], dtype: str = "fp16",
             min_compute_ratio: float = 2.0) -> list[dict[str, Any]]:
    """Every (low, high) pair of datasheet rows with `dtype` where `high` has at least
    `min_compute_ratio`× the compute ("a card with much more compute", C3): predicted
    speed-ups for a memory-bound kernel (bandwidth ratio) and a compute-bound one (FLOP ratio)."""
    roofs = sorted((Roofline.from_hardware(r) for r in rows if r.get(DTYPE_COLUMNS[dtype])),
                   key=lambda r: r.peak(dtype))
    pairs = [{"low": lo.name, "high": hi.name, **speedup_prediction(lo, hi, dtype)}
             for i, lo in enumerate(roofs) for hi in roofs[i + 1:]]
    return [p for p in pairs if p["compute_bound"] >= min_compute_ratio]


def speedup_prediction(low: Roofline, high: Roofline, dtype: str = "bf16") -> dict[str, float]:
    """C3: predicted speed-up of `high` over `low` for a memory-bound kernel (bandwidth
    ratio) and a compute-bound one (peak ratio)."""
    return {"memory_bound": high.bandwidth / low.bandwidth,
            "compute_bound": high.peak(dtype) / low.peak(dtype)}


# ------------------------------------------------------------------------------ plotting


def plot(roof: Roofline, points: Iterable[Any] = (), ax=None, dtypes: Sequence[str] | None = None,
         label_points: bool = True, labels: Sequence[str] | None = None, imin: float = 1e-2,
         imax: float = 1e4):
    """Log-log roofline: one roof per dtype, the bandwidth slope, and measured points.

    `points` are objects with .name, .dtype, .flops, .bytes, .time_s (e.g. bench
    `KernelResult`s); each is labelled with its name (or `labels[i]`) and its % of the roof for
    its dtype. Returns the axes.
    """
    import numpy as np

    ax = axes(ax, (8, 5))
    xs = np.logspace(math.log10(imin), math.log10(imax), 200)
    # Roofs in greys with one line style each: they share the bandwidth slope, and a dashed or
    # dotted roof over a solid one leaves both visible. The points take the colours.
    styles = [("0.1", "-", 2.4), ("0.45", "--", 1.8), ("0.6", ":", 2.2), ("0.3", "-.", 1.6)]
    for k, dt in enumerate(dtypes or list(roof.peaks)):
        colour, ls, lw = styles[k % len(styles)]
        ax.plot(xs, [roof.attainable(x, dt) for x in xs], lw=lw, ls=ls, color=colour, zorder=2 + 0.1 * k,
                label=f"{dt} roof {roof.peak(dt) / 1e9:.3g} GFLOP/s, ridge {roof.ridge(dt):.3g} FLOP/B")
    ax.set_xscale("log")
    ax.set_yscale("log")
    px, py, texts, over = [], [], [], False
    for i, p in enumerate(points):
        dt = p.dtype if p.dtype in roof.peaks else next(iter(roof.peaks))
        inten, achieved = p.flops / p.bytes, p.flops / p.time_s
        ax.scatter([inten], [achieved], s=30, zorder=4, color=f"C{i % 10}")
        pct = 100 * achieved / roof.attainable(inten, dt)
        over |= pct > 100
        px.append(inten), py.append(achieved)
        texts.append(f"{labels[i] if labels else p.name} {pct:.0f}%" + ("*" if pct > 100 else ""))
    tidy_log_axes(ax)
    if label_points and texts:
        place_labels(ax, px, py, texts)
    if label_points and over:
        caption(ax, "* above 100 %: the roof is the best one probe measured (STREAM for bytes/s, one GEMM "
                    "for FLOP/s), not a hard limit. A kernel that keeps its data in cache moves fewer DRAM "
                    "bytes than counted, and on a busy machine timing noise alone moves a point by 10 % or more.")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("performance (FLOP/s)")
    ax.set_title(f"roofline: {roof.name}, bandwidth {roof.bandwidth / 1e9:.3g} GB/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    return ax


# --------------------------------------------------------------- transformer, analytically


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """One layer type of one block: FLOPs and bytes of one instance; `count` instances per model."""

    name: str
    count: int
    flops: float
    weight_bytes: float
    act_bytes: float
    kv_bytes: float
    intensity: float
    bound: str
    time_s: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.act_bytes + self.kv_bytes


def _positive(**kw: int) -> None:
    for k, v in kw.items():
        if not (isinstance(v, int) and v >= 1):
            raise ValueError(f"{k} must be an integer >= 1, got {v!r}")


def layer_costs(cfg: Any, roof: Roofline, phase: str, *, batch: int = 1, seq_len: int = 1,
                context: int = 1, dtype: str = "bf16") -> list[LayerCost]:
    """LLM-Viewer-style per-layer roofline of one forward step of decoder `cfg` (a
    `labkit.model.ModelConfig`, e.g. ``get_config("7b")``: Llama layout, RMSNorm, GQA, SwiGLU).

    prefill: `batch` prompts of `seq_len` tokens (causal attention, fused: no S×S scores
    in memory). decode: `batch` sequences each generating one token with `context` tokens
    in the KV cache. Weights, activations and KV are `dtype` (bytes from `labkit.dtypes`).
    Activation bytes count each op's input read and output written once (unfused ops).
    """
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    _positive(batch=batch, seq_len=seq_len, context=context)
    b = dtypes.nbytes(dtype)
    d, hd, H, Hkv, ff, L = cfg.dim, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim, cfg.n_layers
    T = batch * (seq_len if phase == "prefill" else 1)  # tokens in this step
    kv_len = seq_len if phase == "prefill" else context
    pairs = batch * (seq_len * (seq_len + 1) / 2 if phase == "prefill" else context)

    def linear(name, fin, fout, tokens=T, count=L, out_to_kv=False):
        out = tokens * fout * b
        return (name, count, 2 * tokens * fin * fout, fin * fout * b,
                tokens * fin * b + (0 if out_to_kv else out), out if out_to_kv else 0)

    specs = [
        ("attn_norm", L, 4 * T * d, d * b, 2 * T * d * b, 0),
        linear("q_proj", d, H * hd),
        linear("k_proj", d, Hkv * hd, out_to_kv=True),   # K, V written to the cache
        linear("v_proj", d, Hkv * hd, out_to_kv=True),
        # fused attention: read Q, write O; read K and V of every cached position once
        ("attention", L, H * pairs * (4 * hd + 5), 0, 2 * T * H * hd * b, 2 * batch * kv_len * Hkv * hd * b),
        linear("o_proj", H * hd, d),
        ("residual", 2 * L, T * d, 0, 3 * T * d * b, 0),
        ("mlp_norm", L, 4 * T * d, d * b, 2 * T * d * b, 0),
        linear("gate_proj", d, ff),
        linear("up_proj", d, ff),
        ("silu_mul", L, 5 * T * ff, 0, 3 * T * ff * b, 0),
        linear("down_proj", ff, d),
        linear("lm_head", d, cfg.vocab_size, tokens=batch, count=1),  # only the last token's logits
    ]
    rows = []
    for name, count, flops, wb, ab, kb in specs:
        nbytes = wb + ab + kb
        inten = flops / nbytes
        rows.append(LayerCost(name, count, float(flops), float(wb), float(ab), float(kb), inten,
                              roof.bound(inten, dtype), roof.time(flops, nbytes, dtype)))
    return rows


def totals(rows: Sequence[LayerCost]) -> dict[str, float]:
    """Whole-model FLOPs, bytes (weights / activations / KV), intensity and predicted time (s)."""
    t = {k: sum(getattr(r, k) * r.count for r in rows)
         for k in ("flops", "weight_bytes", "act_bytes", "kv_bytes", "time_s")}
    t["bytes"] = t["weight_bytes"] + t["act_bytes"] + t["kv_bytes"]
    t["intensity"] = t["flops"] / t["bytes"]
    return t


def format_costs(rows: Sequence[LayerCost]) -> str:
    """A fixed-width table of `layer_costs` output (per instance; count = instances in the model)."""
    lines = [f"{'layer':<11}{'count':>6}{'GFLOP':>10}{'weights MB':>12}{'act MB':>10}{'KV MB':>9}"
             f"{'FLOP/B':>9}  {'bound':<8}{'time':>10}"]
    for r in rows:
        lines.append(f"{r.name:<11}{r.count:>6}{r.flops / 1e9:>10.3g}{r.weight_bytes / 1e6:>12.3g}"
                     f"{r.act_bytes / 1e6:>10.3g}{r.kv_bytes / 1e6:>9.3g}{r.intensity:>9.3g}  "
                     f"{r.bound:<8}{r.time_s * 1e6:>8.3g} µs")
    return "\n".join(lines)


# ------------------------------------------------------------------ prediction vs measurement


def assess(roof: Roofline, flops: float, nbytes: float, seconds: float | None = None,
           dtype: str = "fp32") -> dict[str, Any]:
    """Roofline prediction for one kernel and, given its measured `seconds`, the comparison.

    predicted: 'memory' | 'compute' from intensity vs ridge; attainable FLOP/s and the
    minimum time (s). measured: achieved FLOP/s and bytes/s, the fraction of each ceiling
    used, % of the roof, and which ceiling the kernel sits closer to (the measured bound).
    """
    inten = flops / nbytes
    out: dict[str, Any] = {"intensity": inten, "predicted": roof.bound(inten, dtype),
                           "attainable_flop_per_s": roof.attainable(inten, dtype),
                           "min_time_s": roof.time(flops, nbytes, dtype)}
    if seconds is not None:
        fl, bw = flops / seconds, nbytes / seconds
        out.update(achieved_flop_per_s=fl, achieved_bytes_per_s=bw,
                   compute_util=fl / roof.peak(dtype), bandwidth_util=bw / roof.bandwidth,
                   pct_of_roof=100 * out["min_time_s"] / seconds)
        out["measured"] = "memory" if out["bandwidth_util"] >= out["compute_util"] else "compute"
    return out


def skinny_point(roof: Roofline, batch: int, d_in: int, d_out: int, dtype: str = "fp32") -> dict[str, Any]:
    """Decode-style linear layer x[batch, d_in] @ W[d_in, d_out]: intensity, bound, time.

    Intensity ≈ batch FLOP/byte·(2/dtype_bytes) while the weight read dominates, so
    batching B requests moves the point right by ~B× until it meets the ridge.
    """
    _positive(batch=batch, d_in=d_in, d_out=d_out)
    b = dtypes.nbytes(dtype)
    flops = 2 * batch * d_in * d_out
    nbytes = (batch * d_in + d_in * d_out + batch * d_out) * b
    return {"batch": batch, "flops": flops, "bytes": nbytes, **assess(roof, flops, nbytes, dtype=dtype)}


def batch_to_reach_ridge(roof: Roofline, d_in: int, d_out: int, dtype: str = "fp32", limit: int = 1 << 16) -> int | None:
    """Smallest decode batch whose linear layer is compute-bound (None if beyond `limit`)."""
    lo, hi = 1, limit
    if skinny_point(roof, hi, d_in, d_out, dtype)["predicted"] == "memory":
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if skinny_point(roof, mid, d_in, d_out, dtype)["predicted"] == "memory":
            lo = mid + 1
        else:
            hi = mid
    return lo
