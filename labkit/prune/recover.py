"""Recovery fine-tune: a short run of the ordinary training loop (`labkit.train.train`)
after pruning, so the remaining weights compensate for the removed ones.

For unstructured and 2:4 pruning the keep-masks are enforced during training: a
gradient hook zeroes the gradient of every removed weight, so AdamW never moves it
(its moments stay 0, decoupled weight decay of 0 is 0), and the masks are re-applied
at the end as a guarantee. Structured-pruned models need no mask: they are just smaller.
"""

from __future__ import annotations

import dataclasses

import torch

from labkit.model import Transformer
from labkit.prune.unstructured import apply_masks
from labkit.train import TrainConfig, train


@dataclasses.dataclass(frozen=True)
class RecoveryBudget:
    """Budget of a recovery fine-tune: `steps` optimizer steps of `batch_size` windows of
    `seq_len` tokens at peak learning rate `lr` (lower than pre-training: the model is
    already trained)."""

    steps: int = 25
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    seed: int = 0

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len

    def __str__(self) -> str:
        return f"{self.steps} steps x {self.batch_size} x {self.seq_len} tokens = {self.tokens:,} tokens, lr {self.lr:g}"

    def train_config(self) -> TrainConfig:
        return TrainConfig(steps=self.steps, batch_size=self.batch_size, seq_len=self.seq_len, lr=self.lr,
                           warmup_steps=max(1, self.steps // 10), min_lr_frac=0.1, weight_decay=0.0,
                           seed=self.seed, log_every=10**9)


def recover(model: Transformer, train_ids: torch.Tensor, budget: RecoveryBudget = RecoveryBudget(),
            masks: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """Fine-tune `model` in place on `train_ids` for `budget`, keeping `masks` (if any).
    Returns the training loop's figures: train_seconds (s), train_tokens, tokens_per_s."""
    if budget.steps < 1:
        raise ValueError(f"recovery needs steps >= 1, got {budget.steps}")
    layout = model.weight_layout
    # Train in the "nk" layout: "kn" gives a tied output head its own copy, which would untie it.
    model.set_weight_layout("nk")
    mods = dict(model.named_modules())
    handles = [mods[n].weight.register_hook(lambda g, m=m: g * m.to(g.dtype)) for n, m in (masks or {}).items()]
    try:
        figures = train(model, train_ids, budget.train_config(), log=lambda _line: None)
    finally:
        for h in handles:
            h.remove()
    if masks:
        apply_masks(model, masks)
    model.set_weight_layout(layout)
    return figures
