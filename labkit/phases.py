"""Chapter 1's measurements: prefill vs decode and the KV cache (the verdicts on C1/C2 are
`labkit.ledger.ch1`'s).

Everything here times a `labkit.model.Transformer` or compares those times with the
analytic transformer roofline (`labkit.roofline.layer_costs`) and with ceilings
measured on this machine (`measure_roofline`). Units: seconds, bytes, FLOP; rates in
FLOP/s and bytes/s; intensity in FLOP/byte.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Sequence

import torch

from labkit import device as _device
from labkit import roofline
from labkit.bench import Report, fingerprint, itemsize, last_level_cache_bytes, run_kernel
from labkit.bench.zoo import DTYPES as TORCH_DTYPES
from labkit.model import generate
from labkit.model.kv_memory import kv_bytes_per_token
from labkit.plots import tidy_log_axes
from labkit.timing import percentile, time_decode_steps


# ----------------------------------------------------------------------- ceilings
def measure_roofline(device: torch.device | str = "cpu", dtype: str = "fp32", gemm_n: int | None = None,
                     llc_multiple: float = 4.0) -> roofline.Roofline:
    """This machine's ceilings, measured quickly: peak = one square GEMM of side `gemm_n`
    (default 4096 on a GPU, which a smaller one cannot fill, else 1024), bandwidth = the best
    STREAM op over a working set `llc_multiple` × the last-level cache. Both are the best of 5
    repeats: on a shared machine a slower repeat measures the other work, not the ceiling."""
    dev = _device.pick(device)
    gemm_n = gemm_n or (4096 if dev.type == "cuda" else 1024)
    ws = int(llc_multiple * last_level_cache_bytes(dev))
    rows = [run_kernel("gemm", dtype=dtype, device=dev, group="matmul", warmup=1, repeat=5,
                       m=gemm_n, n=gemm_n, k=gemm_n)]
    for op, arrays in (("copy", 2), ("triad", 3)):
        rows.append(run_kernel(op, dtype=dtype, device=dev, group="stream", warmup=2, repeat=5,
                               n=ws // (arrays * itemsize(dtype))))
    return roofline.Roofline.from_report(Report(fingerprint(dev), rows), dram_multiple=llc_multiple / 2)


def measure_rooflines(device: torch.device | str, dtypes: Iterable[str], **kw: Any) -> roofline.Roofline:
    """One `Roofline` with a measured peak (FLOP/s) for each distinct dtype in `dtypes` (one
    `measure_roofline` each, `kw` passed on), so prefill and decode can each be predicted
    in their own dtype. Bandwidth (bytes/s) is the best of those runs: STREAM moves bytes,
    whose rate does not depend on the dtype, so the runs are repeats of one ceiling."""
    roofs = {dt: measure_roofline(device, dt, **kw) for dt in dict.fromkeys(dtypes)}
    if not roofs:
        raise ValueError("dtypes is empty; give at least one, e.g. ['fp32']")
    first = next(iter(roofs.values()))
    return dataclasses.replace(first, peaks={dt: r.peak(dt) for dt, r in roofs.items()},
                               bandwidth=max(r.bandwidth for r in roofs.values()))


def phase_models(model: Any, dtypes: Mapping[str, str]) -> dict[str, Any]:
    """Phase -> `model` cast to that phase's dtype (`dtypes`: phase -> "fp32" | "bf16" | ...).
    A phase already in the model's dtype gets `model` itself; each other dtype gets one
    deep copy cast with ``.to`` (the same weights, rounded), shared by the phases that want
    it, so memory doubles only when prefill and decode really differ."""
    copies: dict[str, Any] = {}
    out = {}
    for phase, dt in dtypes.items():
        if dt not in TORCH_DTYPES:
            raise ValueError(f"dtype {dt!r} of phase {phase!r} unknown; choose one of {', '.join(TORCH_DTYPES)}")
        if TORCH_DTYPES[dt] == model.dtype:
            out[phase] = model
        else:
            if dt not in copies:
                copies[dt] = copy.deepcopy(model).to(TORCH_DTYPES[dt])
            out[phase] = copies[dt]
    return out


# ----------------------------------------------------------------------- analytic
def analytic(cfg: Any, roof: roofline.Roofline, phase: str, *, batch: int = 1, seq_len: int = 1,
             context: int = 1, dtype: str = "fp32") -> dict[str, float]:
    """Whole-model FLOPs, bytes, intensity (FLOP/B) and roofline time (s) of one step."""
    rows = roofline.layer_costs(cfg, roof, phase, batch=batch, seq_len=seq_len,
                                context=context, dtype=dtype)
    return roofline.totals(rows)


# ----------------------------------------------------------------------- timing
def _sync_time(fn, dev: torch.device) -> float:
    _device.synchronize(dev)
    t0 = time.perf_counter()
    fn()
    _device.synchronize(dev)
    return time.perf_counter() - t0


@torch.inference_mode()
def time_prefill(model: Any, prompt_lens: Sequence[int], roof: roofline.Roofline, *, batch: int = 1,
                 repeat: int = 3, dtype: str = "fp32") -> list[dict[str, float]]:
    """Median seconds of `model.prefill` per prompt length, with achieved and analytic rates."""
    rows, dev = [], model.device
    for T in prompt_lens:
        cache = model.new_cache(batch, T)
        tokens = torch.randint(0, model.config.vocab_size, (batch, T), device=dev)

        def run():
            cache.reset()
            model.prefill(tokens, cache)
        run()  # warm-up: first call of a shape pays allocation and kernel selection
        s = percentile([_sync_time(run, dev) for _ in range(repeat)], 50)
        a = analytic(model.config, roof, "prefill", batch=batch, seq_len=T, dtype=dtype)
        rows.append({"prompt_len": T, "batch": batch, "seconds": s, "tokens_per_s": batch * T / s,
                     "flops": a["flops"], "bytes": a["bytes"], "flop_per_s": a["flops"] / s,
                     "intensity": a["intensity"], "roofline_s": a["time_s"]})
    return rows


@torch.inference_mode()
def time_decode(model: Any, batches: Sequence[int], contexts: Sequence[int], roof: roofline.Roofline, *,
                steps: int = 8, repeat: int = 3, dtype: str = "fp32") -> list[dict[str, float]]:
    """Median seconds per `decode_step` for each (batch, context), with bytes/s achieved.

    The cache is "filled" by rewinding it to `context` before each timed call
    (`labkit.timing.time_decode_steps`; what it holds does not change the time), so a long
    context costs no prefill. Bytes per step = weights read once +
    the KV cache read (batch × context × KV bytes per token): the memory-bound floor.
    """
    rows, dev, cfg = [], model.device, model.config
    kv_per_tok = kv_bytes_per_token(cfg, model.dtype)
    for B in batches:
        for ctx in contexts:
            cache = model.new_cache(B, ctx + steps)
            tok = torch.randint(0, cfg.vocab_size, (B,), device=dev)
            s = time_decode_steps(model, cache, tok, ctx, steps=steps, warmup=1, repeat=repeat).median / steps
            ctx_mid = ctx + steps // 2  # the KV read grows by one token per step
            nbytes = model.weight_bytes_per_step(B) + B * ctx_mid * kv_per_tok
            a = analytic(cfg, roof, "decode", batch=B, context=ctx_mid, dtype=dtype)
            rows.append({"batch": B, "context": ctx, "s_per_step": s, "tokens_per_s": B / s,
                         "bytes_per_step": nbytes, "bytes_per_s": nbytes / s,
                         "bandwidth_frac": nbytes / s / roof.bandwidth, "flops": a["flops"], "bytes": a["bytes"],
                         "flop_per_s": a["flops"] / s, "intensity": a["intensity"],
                         "roofline_s": a["time_s"]})
    return rows


def cache_vs_nocache(model: Any, prompt_len: int, new_tokens: int, seed: int = 0) -> dict[str, float]:
    """Seconds to generate `new_tokens` greedily with and without the KV cache."""
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len),
                           generator=torch.Generator().manual_seed(seed)).tolist()
    out = {}
    for use_cache in (True, False):
        generate(model, prompt, max_new_tokens=2, use_cache=use_cache)  # warm-up
        out["cache_s" if use_cache else "nocache_s"] = _sync_time(
            lambda: generate(model, prompt, max_new_tokens=new_tokens, use_cache=use_cache), model.device)
    out["speedup"] = out["nocache_s"] / out["cache_s"]
    return out


# ----------------------------------------------------------------------- plots
def roofline_points(prefill: list[dict], decode: list[dict], dtype: str = "fp32",
                    decode_dtype: str | None = None) -> tuple[list, list[str]]:
    """Measured steps as points for `labkit.roofline.plot` (analytic FLOPs and bytes), with labels.
    Prefill points carry `dtype`, decode points `decode_dtype` (default `dtype`), so each is
    measured against the roof of the dtype it ran in. Decode appears at its shortest context
    only: the context barely moves a point, and labels of points on top of each other are
    unreadable."""
    decode_dtype = decode_dtype or dtype
    ctx = min(r["context"] for r in decode)
    decode = [r for r in decode if r["context"] == ctx]
    pts = [SimpleNamespace(name="prefill", dtype=dtype, flops=r["flops"], bytes=r["bytes"], time_s=r["seconds"])
           for r in prefill]
    pts += [SimpleNamespace(name="decode", dtype=decode_dtype, flops=r["flops"], bytes=r["bytes"],
                            time_s=r["s_per_step"]) for r in decode]
    labels = [f"prefill T={r['prompt_len']}" for r in prefill]
    labels += [f"decode B={r['batch']} ctx={r['context']}" for r in decode]
    return pts, labels


def plot_phases(prefill: list[dict], decode: list[dict]):
    """Three panels: prefill time vs prompt length, decode step time vs batch (one line per
    context), tokens/s of both phases; measured (solid) and roofline prediction (dashed)."""
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.6))
    T = [r["prompt_len"] for r in prefill]
    a.loglog(T, [1e3 * r["seconds"] for r in prefill], "o-", label="measured")
    a.loglog(T, [1e3 * r["roofline_s"] for r in prefill], "k--", label="roofline bound")
    a.set(xlabel="prompt length (tokens)", ylabel="prefill time (ms)", title="prefill")
    for ctx in sorted({r["context"] for r in decode}):
        rows = [r for r in decode if r["context"] == ctx]
        B = [r["batch"] for r in rows]
        line, = b.loglog(B, [1e3 * r["s_per_step"] for r in rows], "o-", label=f"context {ctx}")
        b.loglog(B, [1e3 * r["roofline_s"] for r in rows], "--", color=line.get_color())
        c.loglog(B, [r["tokens_per_s"] for r in rows], "o-", color=line.get_color(), label=f"decode, context {ctx}")
    b.set(xlabel="batch (sequences)", ylabel="time per decode step (ms)", title="decode (dashed: roofline)")
    for r in prefill[-1:]:
        c.axhline(r["tokens_per_s"], color="k", ls=":", label=f"prefill, {r['prompt_len']}-token prompt")
    c.set(xlabel="batch (sequences)", ylabel="tokens/s", title="throughput")

    for ax, xs in ((a, T), (b, B), (c, B)):
        tidy_log_axes(ax)  # plain numbers on the y axis, no "6x10^1"-style minor labels
        ax.set_xticks(xs, [str(x) for x in xs])  # the measured sizes
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
