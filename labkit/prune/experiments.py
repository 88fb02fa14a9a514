"""Chapter 4.2's pruning measurements as functions returning plain rows (dicts), shared by
notebook 05 and ``python -m labkit.benches.prune``. Every number is measured when called.

C12 (unstructured sparsity gives no speed-up on dense hardware; structured pruning does)
is measured three ways: one large matmul, a sparsity sweep to find where CSR starts to
win, and decode steps of a memory-bound model. Accuracy is measured on the trained tiny
checkpoint, before and after a recovery fine-tune.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from labkit.model import Transformer, perplexity
from labkit.prune.formats import SparseLinear, sparse_nbytes, to_sparse, to_sparse_model
from labkit.prune.recover import RecoveryBudget, recover
from labkit.prune.semistructured import prune_24
from labkit.prune.structured import prune_structured
from labkit.prune.unstructured import prune_unstructured, smallest_k_mask
from labkit.device import use_threads
from labkit.timing import decode_tok_s, measure


def bench_sizes(size: str, threads: int | None) -> dict:
    """The "pruning" preset at `size` for a chapter-4 bench (prune, distill), with torch on
    `threads` threads (None: the preset's) and seeded, so both benches start alike."""
    from labkit import presets

    P = presets.sizes("pruning", size)
    use_threads(threads or P["threads"])
    torch.manual_seed(0)
    return P


def _kn(w: torch.Tensor) -> torch.Tensor:
    """`w` in the decoder's "kn" storage (a transposed view of a K×N block), the layout
    its dense matmuls run in (see Transformer.set_weight_layout)."""
    return w.t().contiguous().t()


def _best_of(fns: dict[object, Callable[[], object]], repeat: int, rounds: int) -> dict[object, float]:
    """Median seconds per call of each fn (by key), best of `rounds` interleaved rounds (a busy
    neighbour on a shared machine then hits one round, not one variant)."""
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            best[k] = min(best[k], measure(fn, warmup=1, repeat=repeat).median)
    return best


def matmul_rows(n: int = 4096, sparsities: Iterable[float] = (0.5, 0.75), batch: int = 1, repeat: int = 5,
                rounds: int = 2, formats: Iterable[str] = ("csr", "coo")) -> list[dict]:
    """One n×n fp32 weight (n=4096: 64 MiB, beyond a typical last-level cache) times a
    (batch × n) input: dense, the same weight magnitude-pruned but kept dense, in sparse
    formats, and structured (the pruned input columns really removed: n × (1-s)·n dense).
    Rows: variant, sparsity, bytes held (MB), time (s), speed-up vs dense."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n, n, generator=g)
    x = torch.randn(batch, n, generator=g)
    fns, sizes = {("dense", 0.0): (lambda wd=_kn(w): F.linear(x, wd))}, {("dense", 0.0): 4 * n * n}
    for s in sparsities:
        kept = _kn(w * smallest_k_mask(w.abs(), round(s * w.numel())))
        fns[("unstructured, kept dense", s)] = lambda wd=kept: F.linear(x, wd)
        sizes[("unstructured, kept dense", s)] = 4 * n * n
        for fmt in formats:
            sp = to_sparse(kept, fmt)
            fns[(f"unstructured, {fmt.upper()}", s)] = lambda sp=sp: torch.sparse.mm(sp, x.t())
            sizes[(f"unstructured, {fmt.upper()}", s)] = sparse_nbytes(sp)
        k = n - round(s * n)  # which columns go does not matter for speed: keep the first k
        small, xs = _kn(w[:, :k].clone()), x[:, :k].contiguous()
        fns[("structured (smaller dense)", s)] = lambda wd=small, xs=xs: F.linear(xs, wd)
        sizes[("structured (smaller dense)", s)] = 4 * n * k
    times = _best_of({f"{v}@{s}": fn for (v, s), fn in fns.items()}, repeat, rounds)
    dense = times["dense@0.0"]
    return [{"variant": v, "sparsity": s, "MB": sizes[(v, s)] / 1e6, "time_s": times[f"{v}@{s}"],
             "speedup_vs_dense": dense / times[f"{v}@{s}"]} for (v, s) in fns]


def breakeven_sweep(n: int = 4096, sparsities: Iterable[float] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99),
                    batch: int = 1, repeat: int = 5, rounds: int = 2) -> dict:
    """CSR vs dense matmul time over a sparsity sweep (same n×n weight as `matmul_rows`).
    Returns {"rows": [...], "breakeven": sparsity where CSR starts to win (linear
    interpolation of the log time ratio between the bracketing points; None if it never
    wins, 0 if it wins everywhere), "bytes_breakeven": where CSR's bytes equal dense's}."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n, n, generator=g)
    x = torch.randn(batch, n, generator=g)
    csr = {s: to_sparse(w * smallest_k_mask(w.abs(), round(s * w.numel())), "csr") for s in sparsities}
    fns = {"dense": lambda wd=_kn(w): F.linear(x, wd)}
    fns.update({s: (lambda sp=sp: torch.sparse.mm(sp, x.t())) for s, sp in csr.items()})
    times = _best_of(fns, repeat, rounds)  # dense timed in every round too, next to the CSR points
    dense = times["dense"]
    rows = [{"sparsity": s, "dense_s": dense, "csr_s": times[s], "csr_over_dense": times[s] / dense,
             "csr_MB": sparse_nbytes(sp) / 1e6, "dense_MB": 4 * n * n / 1e6} for s, sp in csr.items()]
    return {"rows": rows, "breakeven": crossing([r["sparsity"] for r in rows], [r["csr_over_dense"] for r in rows]),
            # CSR int32 holds 8 bytes per non-zero (value + column) vs 4 per dense weight.
            "bytes_breakeven": 0.5}


def crossing(xs: list[float], ratios: list[float]) -> float | None:
    """First x where `ratios` (sparse time / dense time) drops to 1 or below, interpolating
    log(ratio) linearly between neighbours; None if it never does."""
    for i, r in enumerate(ratios):
        if r <= 1:
            if i == 0:
                return xs[0]
            a, b = math.log(ratios[i - 1]), math.log(r)
            return xs[i - 1] + (xs[i] - xs[i - 1]) * a / (a - b)
    return None


def decode_rows(preset: str = "small", overrides: dict | None = None, sparsities: Iterable[float] = (0.5, 0.75),
                formats: Iterable[str] = ("csr",), batch: int = 1, repeat: int = 5, rounds: int = 2) -> list[dict]:
    """Decode-step speed of a random-init `preset` (memory-bound: weights >> cache) for
    dense, unstructured-kept-dense, unstructured in sparse `formats`, and structured, at
    each sparsity. Rows: variant, sparsity, weight MB read per step, tokens/s, measured
    speed-up vs dense and the speed-up predicted from bytes alone."""
    base = Transformer.from_preset(preset, **(overrides or {}))
    models = {("dense", 0.0): base}
    for s in sparsities:
        kept, _ = prune_unstructured(base, s, scope="layer")
        models[("unstructured, kept dense", s)] = kept
        for fmt in formats:
            models[(f"unstructured, {fmt.upper()}", s)] = to_sparse_model(kept, fmt)
        models[("structured", s)] = prune_structured(base, s)
    # Time every dense variant as a fresh copy (the sparse ones were just built by one): measured
    # here, a model's construction path alone (init + layout change vs one copy) moved decode
    # speed by ~10%, which would pass for a pruning effect.
    for key, m in models.items():
        if not any(isinstance(mod, SparseLinear) for mod in m.modules()):
            models[key] = copy.deepcopy(m)
    rows = []
    for (v, s), m in models.items():
        # weight_bytes_per_step sees parameters and buffers; sparse weights are plain tensors, added here
        sparse = sum(mod.nbytes for mod in m.modules() if isinstance(mod, SparseLinear))
        rows.append({"variant": v, "sparsity": s, "read_MB_per_step": (m.weight_bytes_per_step() + sparse) / 1e6})
    for _ in range(rounds):
        for row, m in zip(rows, models.values()):
            row["tok_s"] = max(decode_tok_s(m, batch=batch, repeat=repeat), row.get("tok_s", 0.0))
    ref = rows[0]
    for r in rows:
        r["speedup_vs_dense"] = r["tok_s"] / ref["tok_s"]
        r["predicted_from_bytes"] = ref["read_MB_per_step"] / r["read_MB_per_step"]
    return rows


def accuracy_rows(model: Transformer, valid: torch.Tensor, train: torch.Tensor, sparsities: Iterable[float] = (0.5, 0.75),
                  budget: RecoveryBudget = RecoveryBudget(), windows: int = 16, calib_windows: int = 4,
                  include_24: bool = True, keep_models: bool = False) -> list[dict]:
    """Validation perplexity of the trained `model` pruned each way, before and after a
    recovery fine-tune of `budget` on `train`. Unstructured: global magnitude (the values
    are the same whether stored dense or CSR, so one row covers both); structured: MLP
    channels + whole KV groups by activation importance on `calib_windows` x 256 train
    tokens, and by weight magnitude alone; 2:4 (50%) if `include_24`.
    With `keep_models` each row carries its recovered model under "model"."""
    base = perplexity(model, valid, max_windows=windows)
    rows = [{"method": "dense", "sparsity": 0.0, "params_M": model.num_params() / 1e6, "ppl_pruned": base,
             "ppl_recovered": base, "recovery_s": 0.0}]
    variants = []
    for s in sparsities:
        variants.append(("unstructured (global magnitude)", s, lambda s=s: prune_unstructured(model, s)))
        variants.append(("structured (activation importance)", s,
                         lambda s=s: (prune_structured(model, s, calib=train, calib_windows=calib_windows), None)))
        variants.append(("structured (weight magnitude)", s, lambda s=s: (prune_structured(model, s), None)))
    if include_24:
        variants.append(("2:4 semi-structured", 0.5, lambda: prune_24(model)))
    for method, s, make in variants:
        pruned, masks = make()
        row = {"method": method, "sparsity": s, "params_M": pruned.num_params() / 1e6,
               "ppl_pruned": perplexity(pruned, valid, max_windows=windows)}
        fig = recover(pruned, train, budget, masks)
        row.update(ppl_recovered=perplexity(pruned, valid, max_windows=windows), recovery_s=fig["train_seconds"])
        if keep_models:
            row["model"] = pruned
        rows.append(row)
    for r in rows:
        r["dppl_pct_pruned"] = 100 * (r["ppl_pruned"] / base - 1)
        r["dppl_pct_recovered"] = 100 * (r["ppl_recovered"] / base - 1)
    return rows


def csr_matches_dense(model: Transformer, sparsity: float, tokens: torch.Tensor) -> float:
    """Largest |logit| difference between an unstructured-pruned model kept dense and the
    same model in CSR: the storage format changes speed, never the result."""
    kept, _ = prune_unstructured(model, sparsity)
    with torch.inference_mode():
        return (kept(tokens) - to_sparse_model(kept, "csr")(tokens)).abs().max().item()
