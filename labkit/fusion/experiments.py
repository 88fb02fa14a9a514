"""Chapter 3's measurements for the ledger's claims C6-C8 (the ledger, `labkit.ledger.ch3`,
predicts and judges; these functions only measure).

* C6: `fixed_cost_fit` (time of one eager op vs its work, the intercept = fixed cost per op),
  `decode_step` / `count_step_ops` / `measure_c6_step` (one decode step of a model: its ops and
  its time), `measure_c6` (the TinyOps chain notebook 03 shows);
* C7: `measure_c7`, eager vs ``torch.compile``d elementwise chains;
* C8: `measure_c8`, a ConvBNReLU block unfolded vs folded + fused;
* the sections of ``python -m labkit.benches.fusion``: `tiny_ops_share` (C6), `chains` (C7),
  `decode_steps` (the decoder's decode step eager vs compiled), `forward_memory` (C9).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from labkit.bench import read_copy_bandwidth
from labkit.device import threads as torch_threads
from labkit.fusion import count, decode, elementwise, fold, memory, overhead
from labkit.model import Transformer, load_tiny
from labkit.timing import measure

# Widths (elements) of the op the fixed cost is fitted over: from nearly no work to enough
# that the work shows (fp32, up to 128 KiB: in cache, one thread, so the slope is work alone).
C6_WIDTHS = (16, 512, 2048, 8192, 32768)


def fixed_cost_fit(device: Any = "cpu", widths: Sequence[int] = C6_WIDTHS, ops: int = 200,
                   rounds: int = 3) -> dict[str, Any]:
    """Seconds per eager op (`overhead.per_op_cost_s`: mul, add, sin) at each width, the best of
    `rounds` interleaved rounds, and the least-squares line time = intercept + slope x elements.
    The intercept (s) is the fixed cost an op pays whatever its work."""
    best = {w: float("inf") for w in widths}
    for _ in range(rounds):
        for w in widths:
            best[w] = min(best[w], overhead.per_op_cost_s(device, width=w, ops=ops))
    x, y = np.array(list(best), float), np.array(list(best.values()))
    slope, icpt = np.polyfit(x, y, 1)
    fit = slope * x + icpt
    r2 = 1 - float(np.sum((y - fit) ** 2)) / max(float(np.sum((y - y.mean()) ** 2)), 1e-30)
    return {"intercept_s": float(icpt), "slope_s_per_element": float(slope), "r2": r2,
            "per_op_s": {int(w): t for w, t in best.items()}}


def decode_step(model: Any, context: int = 32) -> Any:
    """A callable running one batch-1 decode step of `model` at `context` tokens (the cache
    rewound each call, so every call does the same work)."""
    cache = model.new_cache(1, context + 8)
    with torch.inference_mode():
        model.prefill(torch.ones(1, context, dtype=torch.long, device=model.device), cache)
    tok = torch.ones(1, dtype=torch.long, device=model.device)

    def step() -> None:
        cache.rewind(context)
        with torch.inference_mode():
            model.decode_step(tok, cache)
    return step


def count_step_ops(step: Any, device: Any = "cpu") -> int:
    """Ops the profiler sees in one call of `step` (counted, not timed)."""
    return count.count_ops(step, device=device).ops


def measure_c6(n_ops: int, device: Any = "cpu", repeat: int = 20) -> dict[str, float]:
    """Ops counted by the profiler and seconds of one `TinyOps(n_ops)` forward: the fastest of
    `repeat` (the chain notebook 03 shows; the verdict of `labkit ledger` times a real model
    step with `measure_c6_step`)."""
    dev = torch.device(device)
    model, x = overhead.TinyOps(n_ops).to(dev), torch.ones(16, device=dev)
    with torch.inference_mode():
        ops = count.count_ops(lambda: model(x), device=dev).ops
        t = measure(lambda: model(x), warmup=2, repeat=repeat, device=dev).min
    return {"ops": ops, "measured_s": t}


def measure_c6_step(step: Any, device: Any = "cpu", repeat: int = 30) -> float:
    """Seconds of one call of `step` (`decode_step`): the fastest of `repeat`, the statistic the
    fit's per-op times use (the least disturbed run on a shared machine)."""
    return measure(step, warmup=3, repeat=repeat, device=device).min


def measure_c7(numel: int, device: Any = "cpu", repeat: int = 5, rounds: int = 5,
               threads: int | None = 1) -> dict[str, dict[str, float]]:
    """Each chain eager vs ``torch.compile``d (one compile per chain, its ATen graph recorded):
    graph nodes, kernels per call, median seconds per call (best of `rounds` interleaved
    rounds: a neighbour's burst then hits a round, not a version), and the fused output's
    max |error| vs eager. On a CPU torch runs on `threads` threads (see
    `labkit.fusion.decode.DecodeBench.run`: inductor's OpenMP barriers stall on a shared
    machine). Raises whatever torch.compile raises when no compiler works."""
    dev = torch.device(device)
    out: dict[str, dict[str, float]] = {}
    with torch_threads(threads if dev.type == "cpu" else None), torch.inference_mode():
        for chain in elementwise.CHAINS:
            fn = elementwise.REFERENCES[chain]
            args = elementwise.make_inputs(chain, numel, device=dev)
            fused, rec = count.compile_counted(fn, dynamic=False)
            err = elementwise.max_abs_error(fused(*args), fn(*args))  # the first call compiles
            best = {"eager": float("inf"), "fused": float("inf")}
            for _ in range(rounds):
                for name, f in (("eager", fn), ("fused", fused)):
                    best[name] = min(best[name], measure(lambda: f(*args), warmup=1, repeat=repeat, device=dev).median)
            out[chain] = {"aten_nodes": sum(rec.graphs),
                          "eager_kernels": count.count_ops(lambda: fn(*args), device=dev).kernels,
                          "fused_kernels": count.count_ops(lambda: fused(*args), device=dev).kernels,
                          "eager_s": best["eager"], "fused_s": best["fused"], "max_error": err}
    return out


def measure_c8(batch: int = 8, channels: int = 32, hw: int = 56, inputs: int = 3, seed: int = 0,
               device: Any = "cpu") -> dict[str, Any]:
    """A ConvBNReLU block with random BN statistics, eval mode, vs its folded and fused form
    (`labkit.fusion.fold.fold_and_fuse`) on `inputs` random inputs: the max relative error,
    and ops (kernels) per call of each."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    block = fold.ConvBNReLU(channels, channels).eval()
    fold.randomize_bn(block[1], g)
    block = block.to(dev)
    fused, fused_act = fold.fold_and_fuse(block)
    worst = 0.0
    with torch.inference_mode():
        for _ in range(inputs):
            x = torch.randn(batch, channels, hw, hw, generator=g).to(dev)
            ref, got = block(x), fused(x)
            worst = max(worst, float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)))
        ops = {name: count.count_ops(lambda m=m: m(x), device=dev).kernels for name, m in
               (("unfolded", block), ("folded", fused))}
    return {"max_rel_error": worst, "unfolded_ops": ops["unfolded"], "folded_ops": ops["folded"],
            "fused_act": fused_act}


def tiny_ops_share(n_ops: int, dev: torch.device) -> dict[str, Any]:
    """C6: a TinyOps(n_ops) forward: counted ops, measured time, per-op overhead, share."""
    model, x = overhead.TinyOps(n_ops).to(dev), torch.ones(16, device=dev)
    with torch.inference_mode():
        ops = count.count_ops(lambda: model(x), device=dev).ops
        t = measure(lambda: model(x), warmup=2, repeat=10, device=dev).median
    per_op = overhead.per_op_overhead_s(dev)
    s = overhead.OverheadShare(ops, per_op, t)
    return {"ops": ops, "measured_s": t, "per_op_s": per_op, "predicted_s": s.predicted_s, "share": s.share}


def chains(numel: int, dev: torch.device, repeat: int, triton_numel: int) -> dict[str, Any]:
    """C7 on memory-bound chains: every version's time, modelled bytes/s, kernels and error,
    the measured read/copy bandwidth, graph nodes, and the Triton check (interpreted on CPU)."""
    # a fixed 256 MiB, far beyond any cache, whatever the chain size
    bw = read_copy_bandwidth(dev, nbytes=256 * 2**20, repeat=3)
    ok, why = elementwise.triton_available(dev)
    out: dict[str, Any] = {"bandwidth": bw, "numel": numel, "triton": why if ok else f"skipped: {why}"}
    for chain in elementwise.CHAINS:
        rows = elementwise.run_chain(chain, numel, device=dev, repeat=repeat,
                                     with_triton=ok and dev.type == "cuda")
        small = elementwise.make_inputs(chain, 4096, width=256, device=dev)
        nodes = count.graph_nodes(elementwise.REFERENCES[chain], *small, device=dev)
        entry: dict[str, Any] = {"rows": rows, "graph_nodes": nodes}
        if ok:
            args = elementwise.make_inputs(chain, triton_numel, width=96, device=dev)
            entry["triton_error"] = elementwise.max_abs_error(elementwise.TRITON[chain](*args),
                                                              elementwise.REFERENCES[chain](*args))
        out[chain] = entry
    return out


def decode_steps(p: dict[str, Any], dev: torch.device) -> list[decode.DecodeResult]:
    """C6/C7 on the decoder: decode step eager at `decode_batches`, compiled at
    `compile_batches` (and CUDA graphs on a GPU)."""
    name = p["decode_model"]
    model = (load_tiny() if name == "tiny" else Transformer.from_preset(name)).to(dev)
    bench = decode.DecodeBench(model, context=p["decode_context"], max_len=p["decode_context"] + 64)
    kw = {"repeat": p["decode_repeat"], "threads": p["decode_threads"] if dev.type == "cpu" else None}
    rows = bench.run("eager", p["decode_batches"], **kw)
    rows += bench.run("compiled", p["compile_batches"], **kw)
    if dev.type == "cuda":
        rows += bench.run("cuda_graph", p["compile_batches"], **kw)
    return rows


def forward_memory(p: dict[str, Any], dev: torch.device) -> memory.ForwardPeak:
    """C9: peak memory of one forward of `mem_model` per autograd mode."""
    model = Transformer.from_preset(p["mem_model"], **p["mem_overrides"]).to(dev)
    return memory.forward_peaks(model, p["mem_batch"], p["mem_seq"])
