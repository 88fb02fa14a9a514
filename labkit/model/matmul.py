"""How the decoder's linear layers multiply on this CPU: the weight layout and the matmul form
per batch size, chosen by timing decode steps here (no setting is right on every machine).

* `Linear`: an nn.Linear whose 2-D forward multiplies in the form its `forms[M]` names:
  "xw" ``x @ W.T``, "wx" ``(W @ x.T).T`` or "split" (`split_k_matmul`);
* `set_weight_layout(model, layout)`: every weight stored "nk" (N x K row-major) or "kn" (the
  same parameter as a transposed view of a K x N block);
* `tune_matmul(model, batches)`: times whole decode steps for every (layout, batch, form) and
  keeps the best layout for all batches and the best form per batch.

Values never change, only the BLAS call and the rounding order of the K sum.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.timing import measure

WEIGHT_LAYOUTS = ("nk", "kn")
# Layout the inference constructors (from_preset, load_checkpoint, load_hf_llama) pick;
# see set_weight_layout for the measurement behind it.
INFERENCE_LAYOUT = "kn"


MATMUL_FORMS = ("xw", "wx", "split")


def split_k_matmul(x: torch.Tensor, w: torch.Tensor, splits: int) -> torch.Tensor:
    """``x @ w.T`` for x (M, K), w (N, K), computed as `splits` partial products over
    equal blocks of the K axis in one batched matmul, then summed: (M, N).

    Why: at M = 1 the BLAS here runs ``x @ w.T`` as a GEMV on a single thread (measured:
    the same GB/s at 1 and 2 threads), while ``bmm`` hands its batch entries to different
    threads. Each block of ``w.T`` is a view in either weight layout, so nothing is copied;
    only the rounding order of the K sum changes. K must be a multiple of `splits`."""
    M, K = x.shape
    if splits < 1 or K % splits:
        raise ValueError(f"split_k_matmul needs splits >= 1 dividing K={K}, got splits={splits!r}")
    if x.device.type == "cpu" and torch.compiler.is_compiling():
        # Inductor lowers a CPU bmm with one row per batch entry to its own multiply-and-sum
        # loop (torch/_inductor/kernel/bmm.py, "memory bound"), measured 2x slower than
        # the BLAS GEMV here (small b1: 44 vs 23 ms per step); a plain mm stays a BLAS call.
        return x @ w.t()
    y = torch.bmm(x.reshape(M, splits, K // splits).transpose(0, 1), w.t().view(splits, K // splits, -1))
    return y.sum(0)


class Linear(nn.Linear):
    """nn.Linear on 2-D input (M, K) that multiplies in the form `forms[M]` chooses:
    "xw" (the default) ``x @ W.T``, "wx" ``(W @ x.T).T``, or "split" (`split_k_matmul`
    with `splits` blocks). Same values up to rounding order; the BLAS call differs, and
    which one is fastest at small M depends on the CPU, the thread count and the weight
    layout, so `tune_matmul` measures it (no setting is right on every machine)."""

    forms: dict[int, str] = {}
    splits: int = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return F.linear(x, self.weight, self.bias)
        # mm/addmm directly: F.linear on CPU goes through matmul and ~8 dispatches, and a
        # decode step of a small model is mostly dispatch overhead
        form = self.forms.get(x.shape[0], "xw")
        if form == "xw":
            w = self.weight.t()
            return torch.mm(x, w) if self.bias is None else torch.addmm(self.bias, x, w)
        if form == "wx":
            y = torch.mm(self.weight, x.t()).t()
        else:
            y = split_k_matmul(x, self.weight, self.splits)
        return y if self.bias is None else y + self.bias


def set_weight_layout(model: Any, layout: str) -> Any:
    """Store every linear layer's weight of `model` as "nk" (PyTorch's default: N×K row-major)
    or "kn" (the same N×K parameter as a transposed view of a K×N row-major block); returns it.

    Why: ``F.linear(x, W)`` multiplies by ``W.T``; in the "kn" layout ``W.T`` is a
    contiguous K×N matrix, and the BLAS on some CPUs streams that layout far faster
    at small batch (measured here: the tiny model's 17 weight matrices at batch 1,
    1.75 ms "nk" vs 0.83 ms "kn"). Values, shapes, names and checkpoints are
    unchanged. A tied output head gets its own transposed copy (the embedding
    lookup keeps the row-major table), which costs vocab·dim more memory.
    """
    if layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight layout {layout!r} not allowed; choose one of {WEIGHT_LAYOUTS}")
    tied = model.config.tie_embeddings
    with torch.no_grad():
        for mod in model.modules():
            if not isinstance(mod, nn.Linear) or (mod is model.output and tied):
                continue
            w = mod.weight.detach()
            mod.weight.data = w.t().contiguous().t() if layout == "kn" else w.contiguous()
        if tied:
            emb = model.tok_embeddings.weight
            model.output.weight = emb if layout == "nk" else nn.Parameter(
                emb.detach().t().contiguous().t(), requires_grad=emb.requires_grad)
    model.weight_layout = layout
    return model


def use_forms(linears: list[Linear], forms: dict[int, str], splits: int) -> None:
    """Every layer in `linears` multiplies a batch of M rows in form `forms[M]` ("xw" if absent)."""
    for mod in linears:
        mod.forms, mod.splits = forms, splits


def _step_time(model: Any, cache: Any, batch: int, context: int, steps: int) -> float:
    """Seconds per decode step: `steps` steps of `batch` sequences after `context` cached tokens
    (the cache rewound first: the same work every call), one timed run."""
    tokens = torch.ones(batch, dtype=torch.long, device=model.device)

    def run() -> None:
        cache.rewind(context)
        for _ in range(steps):
            model.decode_step(tokens, cache)
    return measure(run, warmup=0, repeat=1, device=model.device).median / steps


def _time_layout(model: Any, layout: str, seconds: dict[tuple[str, int, str], float], caches: dict[int, Any],
                 linears: list[Linear], splits: int, context: int, steps: int, keep: bool) -> None:
    """One round over the ways of `layout` still in the running; with `keep`, each way's time
    lowers its entry in `seconds` (s per decode step)."""
    set_weight_layout(model, layout)
    for way in [w for w in seconds if w[0] == layout]:
        if _out_of_running(seconds, way):
            continue
        use_forms(linears, {way[1]: way[2]}, splits)
        t = _step_time(model, caches[way[1]], way[1], context, steps)
        if keep:
            seconds[way] = min(seconds[way], t)


def _out_of_running(seconds: dict[tuple[str, int, str], float], way: tuple[str, int, str]) -> bool:
    """A way measured once at over 2x the best for its batch is not timed again."""
    best = min(t for (_, b, _), t in seconds.items() if b == way[1])
    return math.isfinite(seconds[way]) and seconds[way] > 2 * best


def _choose(seconds: dict[tuple[str, int, str], float], batches: tuple[int, ...],
            forms_here: tuple[str, ...]) -> tuple[str, dict[int, str]]:
    """The layout and its best form per batch. One layout serves every batch size: the one whose
    worst slowdown against the best way for some batch is smallest (plain seconds would let
    batch 8 outvote batch 1)."""
    forms = {lay: {b: min(forms_here, key=lambda f: seconds[lay, b, f]) for b in batches} for lay in WEIGHT_LAYOUTS}
    fastest = {b: min(t for (_, bb, _), t in seconds.items() if bb == b) for b in batches}
    layout = min(WEIGHT_LAYOUTS, key=lambda lay: max(seconds[lay, b, forms[lay][b]] / fastest[b] for b in batches))
    return layout, forms[layout]


def tune_matmul(model: Any, batches: tuple[int, ...] = (1, 8), repeat: int = 3, steps: int = 4,
                context: int = 16) -> dict:
    """Choose by measurement, on this machine and thread count, how `model`'s linear layers
    multiply at decode batch b (b in `batches`): the weight layout (one for all b: "nk" or "kn",
    see `set_weight_layout`) and per b the form, ``F.linear(x, W)`` ("xw"), ``(W @ x.T).T``
    ("wx") or the K axis split across threads ("split", `split_k_matmul`; a candidate when torch
    has >= 2 threads and they divide every layer's K). Returns ``{"layout": ..., "forms": {b:
    form}, "splits": s, "seconds": {(layout, b, form): s per decode step}}``.

    Why measure: at small M these BLAS calls differ 2x and more, and which wins differs
    between CPUs (chapter 1's layout measurement). Why whole decode steps (`steps` of
    them after a `context`-token prompt, best of `repeat` interleaved rounds; a way
    measured at over 2x the best for its batch drops out after one round) rather
    than each matmul alone: a matmul timed alone finds its weights in cache, while in
    a step they stream in after everything else; on the tiny model here that ranked
    the forms backwards. Values are unchanged; only rounding order may differ."""
    linears = [mod for mod in model.modules() if isinstance(mod, Linear)]
    splits = torch.get_num_threads()
    can_split = splits > 1 and all(mod.weight.shape[1] % splits == 0 for mod in linears)
    forms_here = MATMUL_FORMS if can_split else ("xw", "wx")
    seconds = {(lay, b, f): math.inf for lay in WEIGHT_LAYOUTS for b in batches for f in forms_here}
    caches = {b: model.new_cache(b, context + steps) for b in batches}
    with torch.inference_mode():
        for b, cache in caches.items():
            model.prefill(torch.ones(b, context, dtype=torch.long, device=model.device), cache)
        for round_ in range(repeat + 1):  # round 0 warms up
            for lay in WEIGHT_LAYOUTS:
                _time_layout(model, lay, seconds, caches, linears, splits, context, steps, keep=round_ > 0)
    layout, forms = _choose(seconds, batches, forms_here)
    set_weight_layout(model, layout)
    use_forms(linears, {b: f for b, f in forms.items() if f != "xw"}, splits)
    return {"layout": layout, "forms": forms, "splits": splits, "seconds": seconds}
