"""The chapter's measurements as functions returning plain rows (dicts), shared by the
notebook and ``python -m labkit.quant.bench``. Every number is measured when called."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from labkit.model import Transformer, perplexity
from labkit.quant.calib import CALIB_METHODS, calibrate, collect_act_stats, plant_outliers, smooth
from labkit.quant.evaluate import decode_tok_s
from labkit.quant.linear import kernel_paths, model_bytes, quantize_model, weight_bytes_per_step

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "data" / "corpus"

# name -> (how to build it from the fp32 model); "bf16"/"fp16" cast, the rest quantize_model.
WEIGHT_SCHEMES = {
    "fp32": dict(),
    "bf16": dict(dtype=torch.bfloat16),
    "fp16": dict(dtype=torch.float16),
    "int8 (int8pack_mm)": dict(scheme="int8", kernel="int8pack_bf16"),
    "int8 (ao dynamic)": dict(scheme="int8", kernel="ao_dynamic"),
    "int8 (dequant)": dict(scheme="int8", kernel="dequant"),
    "int4-g128 (int4pack_mm)": dict(scheme="int4-g128"),
    "int4-g32 (int4pack_mm)": dict(scheme="int4-g32"),
    "int4-g32 (dequant)": dict(scheme="int4-g32", kernel="dequant"),
    "mixed int4-g32, fp32 output": dict(scheme="int4-g32", keep=["output"]),
}


def corpus_ids(split: str, max_chars: int | None = None) -> torch.Tensor:
    """Token ids of data/corpus/{split}.txt ("train" for calibration, "valid" for evaluation)."""
    from labkit.tokenizer import load_tokenizer

    if split not in ("train", "valid"):
        raise ValueError(f"split={split!r} not allowed; choose one of ('train', 'valid')")
    text = (CORPUS / f"{split}.txt").read_text(encoding="utf-8")
    return torch.tensor(load_tokenizer().encode(text[:max_chars]), dtype=torch.long)


def build(model: Transformer, name: str) -> Transformer:
    """The variant `name` of `WEIGHT_SCHEMES` built from the fp32 `model` (a copy)."""
    if name not in WEIGHT_SCHEMES:
        raise ValueError(f"scheme {name!r} not allowed; choose one of {list(WEIGHT_SCHEMES)}")
    spec = dict(WEIGHT_SCHEMES[name])
    if "dtype" in spec:
        import copy
        return copy.deepcopy(model).to(spec["dtype"])
    if not spec:
        return model
    return quantize_model(model, spec.pop("scheme"), **spec)


def describe(model: Transformer) -> str:
    """The kernel paths of `model`'s linears, as one line."""
    return "; ".join(f"{n}x {k}" for k, n in kernel_paths(model).items())


def weight_table(model: Transformer, valid: torch.Tensor, names: Iterable[str], windows: int,
                 batches: Iterable[int] = (1, 8), repeat: int = 5, ppl_windows: dict | None = None) -> list[dict]:
    """Per variant: validation perplexity on `windows` x 256 tokens (`ppl_windows` overrides
    per name; 0 skips it), its change vs fp32 in % on the same windows, bytes held (MB),
    weight bytes read per decode step (MB), decode tokens/s at each batch, kernel path."""
    rows, fp32_ppl = [], {}  # fp32 perplexity per window count, so every Δ compares like with like
    for name in names:
        m = build(model, name)
        w = (ppl_windows or {}).get(name, windows)
        row = {"scheme": name, "ppl": float("nan"), "dppl_pct": float("nan"), "ppl_windows": w}
        if w:
            if w not in fp32_ppl:
                fp32_ppl[w] = perplexity(model, valid, max_windows=w)
            row["ppl"] = perplexity(m, valid, max_windows=w)
            row["dppl_pct"] = 100 * (row["ppl"] / fp32_ppl[w] - 1)
        row.update(model_MB=model_bytes(m) / 1e6, read_MB_per_step=weight_bytes_per_step(m) / 1e6)
        for b in batches:
            row[f"tok_s_b{b}"] = decode_tok_s(m, batch=b, repeat=repeat)
        row["kernel_path"] = describe(m)
        rows.append(row)
    return rows


def c10_decode(preset: str = "small", overrides: dict | None = None, names: Iterable[str] = (
        "fp32", "fp16", "int8 (int8pack_mm)", "int8 (ao dynamic)", "int4-g128 (int4pack_mm)"), batches: Iterable[int] = (1,),
        repeat: int = 5, rounds: int = 3) -> list[dict]:
    """C10 on a memory-bound (random-init) preset: bytes read per decode step and decode
    tokens/s of each variant, plus the speed-up predicted from bytes alone vs fp32.

    The variants are timed in `rounds` interleaved rounds and each keeps its best round
    (like STREAM's best-of): on a shared machine a neighbour's load hits one round, not
    one variant, so the comparison stays fair.
    """
    base = Transformer.from_preset(preset, **(overrides or {}))
    models = {name: build(base, name) for name in names}
    rows = [{"scheme": n, "model_MB": model_bytes(m) / 1e6, "read_MB_per_step": weight_bytes_per_step(m) / 1e6}
            for n, m in models.items()]
    for _ in range(rounds):
        for row in rows:
            for b in batches:
                rate = decode_tok_s(models[row["scheme"]], batch=b, repeat=repeat)
                row[f"tok_s_b{b}"] = max(rate, row.get(f"tok_s_b{b}", 0.0))
    ref = rows[0]
    for r in rows:
        r["kernel_path"] = describe(models[r["scheme"]])
        r["bytes_ratio_vs_fp32"] = r["read_MB_per_step"] / ref["read_MB_per_step"]
        r["predicted_speedup"] = 1 / r["bytes_ratio_vs_fp32"]
        for b in batches:
            r[f"speedup_b{b}"] = r[f"tok_s_b{b}"] / ref[f"tok_s_b{b}"]
            r[f"GB_s_b{b}"] = r["read_MB_per_step"] * r[f"tok_s_b{b}"] / b / 1e3
    return rows


def w8a8_table(model: Transformer, train: torch.Tensor, valid: torch.Tensor, windows: int,
               calib_windows: int = 8, outlier_factor: float = 100.0, n_outliers: int = 4,
               alphas: Iterable[float] = (0.5,)) -> list[dict]:
    """Validation perplexity of simulated W8A8 (int8 per-channel weights, int8 activations)
    for each calibration method, without and with planted outlier channels, then the
    repairs: per-token / per-channel activation scales, SmoothQuant α, keep in fp32."""
    rows = []
    planted = plant_outliers(model, n_channels=n_outliers, factor=outlier_factor)
    for label, m in (("clean", model), (f"outliers x{outlier_factor:g}", planted)):
        stats = collect_act_stats(m, train, n_windows=calib_windows)
        rows.append({"model": label, "scheme": "fp32", "ppl": perplexity(m, valid, max_windows=windows)})
        for method in CALIB_METHODS:
            q = quantize_model(m, "int8", act_mode="tensor", act_scales=calibrate(stats, method))
            rows.append({"model": label, "scheme": f"W8A8 per-tensor {method}",
                         "ppl": perplexity(q, valid, max_windows=windows)})
    repairs = {"W8A8 per-token (dynamic)": quantize_model(planted, "int8", act_mode="token"),
               "W8A8 per-channel (static)": quantize_model(
                   planted, "int8", act_mode="channel", act_scales=calibrate(stats, "minmax", "channel")),
               "W8A8 minmax, wqkv+w13 kept fp32": quantize_model(
                   planted, "int8", act_mode="tensor", act_scales=calibrate(stats, "minmax"),
                   keep=["*.wqkv", "*.w13"])}
    for alpha in alphas:
        sm = smooth(planted, stats, alpha)
        repairs[f"SmoothQuant a={alpha:g} + W8A8 minmax"] = quantize_model(
            sm, "int8", act_mode="tensor", act_scales=calibrate(collect_act_stats(sm, train, calib_windows), "minmax"))
    for name, q in repairs.items():
        rows.append({"model": rows[-1]["model"], "scheme": name, "ppl": perplexity(q, valid, max_windows=windows)})
    return rows


def format_rows(rows: list[dict]) -> str:
    """A plain-text table of `rows` (floats to 4 significant figures)."""
    if not rows:
        return ""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    cell = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    widths = {c: max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(cell(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def c10_verdict(rows: list[dict], batch: int = 1) -> dict:
    """C10 prediction vs measurement from `c10_decode` rows: the bytes ratios (int8 is a
    quarter of fp32, half of fp16) and the best int8 decode speed-up vs the byte ratio."""
    by = {r["scheme"]: r for r in rows}
    int8 = [r for r in rows if r["scheme"].startswith("int8")]
    best = max(int8, key=lambda r: r[f"speedup_b{batch}"])
    out = {"int8_over_fp32_bytes": by[int8[0]["scheme"]]["read_MB_per_step"] / by["fp32"]["read_MB_per_step"],
           "best_int8": best["scheme"], "predicted_speedup": best["predicted_speedup"],
           "measured_speedup": best[f"speedup_b{batch}"]}
    if "fp16" in by:
        out["int8_over_fp16_bytes"] = int8[0]["read_MB_per_step"] / by["fp16"]["read_MB_per_step"]
    out["share_of_prediction"] = out["measured_speedup"] / out["predicted_speedup"]
    out["bytes_claim_holds"] = abs(out["int8_over_fp32_bytes"] - 0.25) < 0.02 and (
        "int8_over_fp16_bytes" not in out or abs(out["int8_over_fp16_bytes"] - 0.5) < 0.04)
    return out


def plot_bytes_vs_ppl(rows: list[dict], ax=None):
    """Scatter of model bytes (MB, log) vs validation perplexity for `weight_table` rows,
    with the Pareto front (no other scheme both smaller and better) joined by a line."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4))[1]
    pts = sorted((r["read_MB_per_step"], r["ppl"], r["scheme"]) for r in rows if r["ppl"] == r["ppl"])
    for x, y, name in pts:
        ax.scatter(x, y)
        ax.annotate(name, (x, y), fontsize=8, xytext=(4, 4), textcoords="offset points")
    front, best = [], float("inf")
    for x, y, _ in pts:
        if y < best:
            front.append((x, y))
            best = y
    ax.plot(*zip(*front), "k--", lw=0.8, label="Pareto front")
    ax.set_xscale("log")
    ax.set_xlabel("weight bytes read per decode step (MB, log scale)")
    ax.set_ylabel("validation perplexity")
    ax.legend()
    return ax


def kv_table(model: Transformer, valid: torch.Tensor, windows: int, memory_gb: float = 16.0,
             context: int | None = None, decode_context: int = 64, repeat: int = 5) -> list[dict]:
    """KV cache in the model's dtype vs int8, both measured through the decoder's `KVCache`:
    bytes per token (allocated bytes / slots), sequences of `context` tokens (default the
    model's max) fitting in `memory_gb` GB, perplexity through the cache, and batch-1 decode
    tokens/s at `decode_context` cached tokens. An fp16 row (bytes only) is added for scale."""
    from labkit.quant.evaluate import decode_tok_s
    from labkit.quant.kv import kv_bytes_per_token, sequences_that_fit

    cfg, context = model.config, context or model.config.max_seq_len
    name = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[model.dtype]
    rows, base = [], None
    for kv_dtype, kind in (("model", name), ("int8", "int8")):
        cache = model.new_cache(1, context, kv_dtype=kv_dtype)
        per_token = cache.nbytes // (context + 1)  # the cache holds one spare slot per row
        assert per_token == kv_bytes_per_token(cfg, kind), "allocated bytes disagree with the formula"
        ppl = perplexity(model, valid, max_windows=windows, kv_dtype=kv_dtype)
        base = base or ppl
        rows.append({"kv": kind, "bytes_per_token": per_token,
                     f"seqs_of_{context}_in_{memory_gb:g}GB": sequences_that_fit(cfg, memory_gb * 1e9, context, kind),
                     "ppl": ppl, "dppl_pct": 100 * (ppl / base - 1),
                     "decode_tok_s": decode_tok_s(model, 1, decode_context, repeat, kv_dtype=kv_dtype)})
    if name == "fp32":
        rows.insert(1, {"kv": "fp16 (bytes only)", "bytes_per_token": kv_bytes_per_token(cfg, "fp16"),
                        f"seqs_of_{context}_in_{memory_gb:g}GB": sequences_that_fit(cfg, memory_gb * 1e9, context, "fp16"),
                        "ppl": float("nan"), "dppl_pct": float("nan"), "decode_tok_s": float("nan")})
    return rows


def sensitivity_scan(model: Transformer, valid: torch.Tensor, scheme: str, windows: int) -> list[dict]:
    """Quantize one linear at a time with `scheme`; rows of (layer, Δ perplexity %), most
    sensitive first."""
    base = perplexity(model, valid, max_windows=windows)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    rows = []
    for name in names:
        q = quantize_model(model, scheme, keep={n: None for n in names if n != name})
        rows.append({"layer": name, "dppl_pct": 100 * (perplexity(q, valid, max_windows=windows) / base - 1)})
    return sorted(rows, key=lambda r: -r["dppl_pct"])


def mixed_precision(model: Transformer, valid: torch.Tensor, scan: list[dict], scheme: str, windows: int,
                    ks: Iterable[int] = (0, 1, 2, 4)) -> list[dict]:
    """Keep the k most sensitive layers of `scan` in fp32, quantize the rest with `scheme`:
    bytes read per step and perplexity change for each k."""
    base = perplexity(model, valid, max_windows=windows)
    rows = []
    for k in ks:
        q = quantize_model(model, scheme, keep=[r["layer"] for r in scan[:k]])
        ppl = perplexity(q, valid, max_windows=windows)
        rows.append({"scheme": f"{scheme}, {k} most sensitive kept fp32", "kept": k, "ppl": ppl,
                     "dppl_pct": 100 * (ppl / base - 1), "read_MB_per_step": weight_bytes_per_step(q) / 1e6})
    return rows
