"""Evaluation: perplexity of a model on a token stream."""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from labkit.model.transformer import Transformer


def perplexity(model: Transformer, ids: Sequence[int] | torch.Tensor, ctx: int = 256,
               batch_size: int = 16, max_windows: int | None = None, kv_dtype: str | None = None) -> float:
    """Perplexity (dimensionless, exp of mean next-token NLL in nats) of `model` on `ids`.

    The stream is cut into non-overlapping windows of `ctx` + 1 tokens that share their
    boundary token, so every token but the first is predicted once, from at most `ctx`
    tokens of context. `max_windows` caps the work (the first windows are used).

    `kv_dtype` None runs the cache-free forward pass. "model" or "int8" runs each window
    through a `KVCache` of that kind with `prefill(..., all_logits=True)`: every token then
    attends to keys and values read back from the cache, exactly what token-by-token decode
    through that cache sees, so "int8" measures the int8 KV cache's accuracy cost.
    """
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ctx < 1 or ctx > model.config.max_seq_len:
        raise ValueError(f"ctx={ctx} must lie in [1, {model.config.max_seq_len}] tokens")
    if ids.numel() < 2:
        raise ValueError("perplexity needs at least 2 tokens")
    starts = list(range(0, ids.numel() - 1, ctx))
    if max_windows is not None:
        starts = starts[:max_windows]
    def logits_of(x: torch.Tensor) -> torch.Tensor:
        if kv_dtype is None:
            return model(x)
        cache = model.new_cache(x.shape[0], x.shape[1], kv_dtype=kv_dtype)
        return model.prefill(x, cache, all_logits=True)

    nll, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        # Full windows are batched; the ragged last window runs on its own.
        full = [s for s in starts if s + ctx + 1 <= ids.numel()]
        rest = [s for s in starts if s + ctx + 1 > ids.numel()]
        for i in range(0, len(full), batch_size):
            win = torch.stack([ids[s: s + ctx + 1] for s in full[i: i + batch_size]]).to(model.device)
            logits = logits_of(win[:, :-1])
            nll += F.cross_entropy(logits.flatten(0, 1).float(), win[:, 1:].flatten(),
                                   reduction="sum").item()
            count += win[:, 1:].numel()
        for s in rest:
            win = ids[s:][None].to(model.device)
            logits = logits_of(win[:, :-1])
            nll += F.cross_entropy(logits[0].float(), win[0, 1:], reduction="sum").item()
            count += win.shape[1] - 1
    model.train(was_training)
    return math.exp(nll / count)


def unigram_perplexity(train_ids: Sequence[int] | torch.Tensor, eval_ids: Sequence[int] | torch.Tensor,
                       vocab_size: int) -> float:
    """Perplexity of the unigram baseline: each token predicted by its train-set
    frequency (add-one smoothed so unseen tokens have non-zero probability)."""
    counts = torch.bincount(torch.as_tensor(train_ids).flatten(), minlength=vocab_size).double() + 1.0
    logp = (counts / counts.sum()).log()
    ev = torch.as_tensor(eval_ids).flatten()
    return math.exp(-logp[ev].mean().item())
