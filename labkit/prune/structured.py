"""Structured pruning: remove whole MLP hidden channels and attention heads.

The result is an ordinary, physically smaller dense `Transformer`: a new `ModelConfig`
(smaller ``hidden_dim``, fewer heads) and sliced weights, so it saves, loads, generates
and runs the same dense kernels, just on fewer bytes. The config stays uniform across
layers (every layer keeps the same *number* of channels and heads); *which* ones a
layer keeps is chosen per layer by importance.

Importance of a channel = (size of what flows through it) × (size of the weights that
read it out), the per-channel form of Wanda's |W|·‖X‖ score:

* MLP hidden channel j: ‖h_j‖₂ over calibration tokens × ‖W2[:, j]‖₂, where h is the
  input of ``w2`` (silu(gate)·up);
* attention head h: ‖y_h‖_F over calibration tokens × ‖Wo[:, h]‖_F, where y_h is the
  head's slice of ``wo``'s input.

Without calibration tokens the activation norm is replaced by the weights that produce
it (‖gate_j‖·‖up_j‖, ‖Wq_h‖_F): pure magnitude, no data needed.

Grouped-query attention ties n_rep query heads to each KV head, so heads go either as
whole KV groups (``head_mode="groups"``: a group's score is the sum of its query heads')
or as the same number of query heads in every group (``"queries"``).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from labkit.model import ModelConfig, Transformer
from labkit.prune.unstructured import check_sparsity

HEAD_MODES = ("groups", "queries")


def kept_count(n: int, sparsity: float) -> int:
    """How many of `n` units survive removing `sparsity` of them (at least one)."""
    return max(1, n - round(check_sparsity(sparsity) * n))


@torch.no_grad()
def channel_importance(model: Transformer, calib: torch.Tensor | None = None, n_windows: int = 4,
                       ctx: int = 256) -> list[dict[str, torch.Tensor]]:
    """Per layer: ``{"mlp": (hidden_dim,), "heads": (n_heads,)}`` importance scores (see the
    module docstring). `calib` (token ids, training text) switches on activation norms,
    measured over `n_windows` windows of `ctx` tokens."""
    cfg = model.config
    H, D = cfg.n_heads, cfg.head_dim
    act: dict[str, torch.Tensor] = {}
    if calib is not None:
        ids = torch.as_tensor(calib, dtype=torch.long).flatten()
        if ids.numel() < n_windows * ctx:
            raise ValueError(f"calibration needs {n_windows * ctx} tokens ({n_windows} x {ctx}), got {ids.numel()}")

        def record(name):
            def hook(_mod, args):
                x = args[0].detach().float().reshape(-1, args[0].shape[-1])
                sq = x.pow(2).sum(0)
                act[name] = sq if name not in act else act[name] + sq
            return hook

        handles = [layer.feed_forward.w2.register_forward_pre_hook(record(f"{i}.mlp"))
                   for i, layer in enumerate(model.layers)]
        handles += [layer.attention.wo.register_forward_pre_hook(record(f"{i}.heads"))
                    for i, layer in enumerate(model.layers)]
        try:
            with torch.inference_mode():
                for w in ids[: n_windows * ctx].reshape(n_windows, ctx).split(4):
                    model(w.to(model.device))
        finally:
            for h in handles:
                h.remove()
    scores = []
    for i, layer in enumerate(model.layers):
        w2 = layer.feed_forward.w2.weight.float()             # (dim, hidden)
        wo = layer.attention.wo.weight.float().view(cfg.dim, H, D)
        if calib is not None:
            mlp_in = act[f"{i}.mlp"].sqrt()
            head_in = act[f"{i}.heads"].view(H, D).sum(-1).sqrt()
        else:
            gate, up = layer.feed_forward.w13.weight.float().chunk(2, dim=0)
            mlp_in = gate.norm(dim=1) * up.norm(dim=1)
            head_in = layer.attention.wqkv.weight.float()[: H * D].view(H, D, -1).pow(2).sum((1, 2)).sqrt()
        scores.append({"mlp": mlp_in * w2.norm(dim=0),
                       "heads": head_in * wo.pow(2).sum((0, 2)).sqrt()})
    return scores


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the `k` largest scores, in ascending index order (keeps the layout)."""
    return scores.topk(k).indices.sort().values


@dataclasses.dataclass
class StructuredPlan:
    """What structured pruning keeps: the smaller config and, per layer, the kept MLP
    channel indices and query-head indices (KV groups follow from the heads)."""

    config: ModelConfig
    mlp: list[torch.Tensor]
    heads: list[torch.Tensor]


def plan_structured(model: Transformer, sparsity: float = 0.5, *, head_sparsity: float | None = None,
                    head_mode: str = "groups", calib: torch.Tensor | None = None,
                    calib_windows: int = 4, calib_ctx: int = 256) -> StructuredPlan:
    """Choose what to keep: `sparsity` of every layer's MLP hidden channels and
    `head_sparsity` (default: `sparsity`) of its attention heads go, the least important
    first (`channel_importance`; `calib` token ids switch on activation norms)."""
    if head_mode not in HEAD_MODES:
        raise ValueError(f"head_mode={head_mode!r} not allowed; choose one of {HEAD_MODES}")
    head_sparsity = sparsity if head_sparsity is None else head_sparsity
    cfg = model.config
    Hkv, rep = cfg.n_kv_heads, cfg.n_rep
    hidden = kept_count(cfg.hidden_dim, sparsity)
    if head_mode == "groups":
        new_kv, new_rep = kept_count(Hkv, head_sparsity), rep
    else:
        new_kv, new_rep = Hkv, kept_count(rep, head_sparsity)
    new_cfg = ModelConfig.from_dict({**cfg.to_dict(), "hidden_dim": hidden, "n_heads": new_kv * new_rep,
                                     "n_kv_heads": new_kv, "head_dim": cfg.head_dim})
    mlp, heads = [], []
    for s in channel_importance(model, calib, calib_windows, calib_ctx):
        mlp.append(_top(s["mlp"], hidden))
        per_group = s["heads"].view(Hkv, rep)
        if head_mode == "groups":  # whole KV groups, each with all its query heads
            groups = _top(per_group.sum(1), new_kv)
            heads.append((groups[:, None] * rep + torch.arange(rep)).flatten())
        else:  # the same number of query heads in every group, so n_rep stays uniform
            heads.append(torch.cat([g * rep + _top(per_group[g], new_rep) for g in range(Hkv)]))
    return StructuredPlan(new_cfg, mlp, heads)


def apply_plan(model: Transformer, plan: StructuredPlan) -> Transformer:
    """A new dense `Transformer` of `plan.config` holding `model`'s kept rows and columns,
    with `model`'s dtype, device and weight layout (`model` is left untouched)."""
    cfg = model.config
    H, Hkv, D, rep = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_rep
    rows = lambda idx, offset: (offset + idx[:, None] * D + torch.arange(D)).flatten()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    for i, (mlp, heads) in enumerate(zip(plan.mlp, plan.heads)):
        p = f"layers.{i}."
        groups = heads[::plan.config.n_rep] // rep  # the KV group of each kept group's first head
        # wqkv's rows are [q heads | k heads | v heads], D rows per head.
        qkv_rows = torch.cat([rows(heads, 0), rows(groups, H * D), rows(groups, (H + Hkv) * D)])
        state[p + "attention.wqkv.weight"] = state[p + "attention.wqkv.weight"][qkv_rows]
        state[p + "attention.wo.weight"] = state[p + "attention.wo.weight"][:, rows(heads, 0)]
        w13 = state[p + "feed_forward.w13.weight"]  # [gate | up] rows
        state[p + "feed_forward.w13.weight"] = torch.cat([w13[mlp], w13[cfg.hidden_dim + mlp]])
        state[p + "feed_forward.w2.weight"] = state[p + "feed_forward.w2.weight"][:, mlp]
    small = Transformer(plan.config)
    small.load_state_dict(state, strict=True)
    return small.to(device=model.device, dtype=model.dtype).eval().set_weight_layout(model.weight_layout)


def prune_structured(model: Transformer, sparsity: float = 0.5, **plan_kwargs) -> Transformer:
    """`model` made physically smaller: `plan_structured` then `apply_plan` (keyword
    arguments as in `plan_structured`)."""
    return apply_plan(model, plan_structured(model, sparsity, **plan_kwargs))


def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Weight shapes of the block linears of layer 0 (what structured pruning shrinks)."""
    return {n: tuple(m.weight.shape) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and n.startswith("layers.0.")}
