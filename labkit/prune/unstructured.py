"""Unstructured magnitude pruning: zero the smallest-|w| weights, keep the shapes.

Only the linear layers inside the transformer blocks are pruned (``wqkv``, ``wo``,
``w13``, ``w2``); the embedding and the output head stay dense, as in the usual
recipes (they are shared / tied and very sensitive). `scope` says who competes:

* ``"global"`` every prunable weight of the model in one ranking (layers end up
  with different sparsities);
* ``"layer"``  each matrix pruned on its own to the same sparsity.

The count is exact: ``round(sparsity * numel)`` weights are zeroed in each ranking,
ties at the threshold broken by position, so the result never drifts from the target.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

SCOPES = ("global", "layer")
PRUNABLE_SUFFIXES = ("attention.wqkv", "attention.wo", "feed_forward.w13", "feed_forward.w2")


def check_sparsity(sparsity: float) -> float:
    """`sparsity` as a float in [0, 1); ValueError naming the allowed range otherwise."""
    if not isinstance(sparsity, (int, float)) or not 0 <= sparsity < 1:
        raise ValueError(f"sparsity={sparsity!r} not allowed; use a fraction in [0, 1) "
                         "(0.5 = half the weights removed)")
    return float(sparsity)


def prunable_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The block linears pruning applies to, by module name (the output head excluded)."""
    out = {n: m for n, m in model.named_modules()
           if isinstance(m, nn.Linear) and n.endswith(PRUNABLE_SUFFIXES)}
    if not out:
        raise ValueError("model has no prunable block linears (wqkv / wo / w13 / w2)")
    return out


def smallest_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean keep-mask over the flat `scores`: False for exactly the `k` smallest.

    Uses a k-th value threshold (no full sort, so it scales to 10^8 weights); among
    scores equal to the threshold the first ones by position are removed.
    """
    flat = scores.reshape(-1)
    keep = torch.ones(flat.numel(), dtype=torch.bool, device=flat.device)
    if k <= 0:
        return keep.view_as(scores)
    thr = flat.kthvalue(k).values
    below = flat < thr
    keep[below] = False
    missing = k - int(below.sum())  # how many threshold-equal scores still go
    ties = torch.nonzero(flat == thr).flatten()[:missing]
    keep[ties] = False
    return keep.view_as(scores)


def magnitude_masks(model: nn.Module, sparsity: float, scope: str = "global") -> dict[str, torch.Tensor]:
    """Keep-masks (bool, each linear's logical N×K shape) removing `sparsity` of the
    prunable weights by |w|, ranked over the whole model or per matrix (`scope`)."""
    sparsity = check_sparsity(sparsity)
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} not allowed; choose one of {SCOPES}")
    linears = prunable_linears(model)
    with torch.no_grad():
        if scope == "layer":
            return {n: smallest_k_mask(m.weight.abs(), round(sparsity * m.weight.numel()))
                    for n, m in linears.items()}
        flat = torch.cat([m.weight.detach().abs().reshape(-1) for m in linears.values()])
        keep = smallest_k_mask(flat, round(sparsity * flat.numel()))
    masks, start = {}, 0
    for n, m in linears.items():
        masks[n] = keep[start: start + m.weight.numel()].view(m.weight.shape)
        start += m.weight.numel()
    return masks


def apply_masks(model: nn.Module, masks: dict[str, torch.Tensor]) -> nn.Module:
    """Zero the masked-out weights of `model` in place (the weight layout is kept)."""
    mods = dict(model.named_modules())
    with torch.no_grad():
        for name, mask in masks.items():
            w = mods[name].weight
            if tuple(mask.shape) != tuple(w.shape):
                raise ValueError(f"mask for {name} has shape {tuple(mask.shape)}, weight {tuple(w.shape)}")
            w.mul_(mask.to(w.device, w.dtype))
    return model


def prune_unstructured(model: nn.Module, sparsity: float, scope: str = "global",
                       inplace: bool = False) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Magnitude-prune `model` to `sparsity` (see `magnitude_masks`); returns the pruned
    model (a copy unless `inplace`) and its keep-masks, for a recovery fine-tune."""
    masks = magnitude_masks(model, sparsity, scope)
    if not inplace:
        model = copy.deepcopy(model)
    return apply_masks(model, masks), masks


def sparsity_of(model: nn.Module) -> float:
    """Fraction of exact zeros among the prunable block weights."""
    ws = [m.weight for m in prunable_linears(model).values()]
    return sum(int((w == 0).sum()) for w in ws) / sum(w.numel() for w in ws)
