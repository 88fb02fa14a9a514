"""KV-cache int8: bytes per token, and the accuracy cost measured by simulation.

Storage: each cached key/value vector (one token, one KV head, `head_dim` values) is held
as int8 codes plus one fp32 scale (symmetric, per token per head). The decoder's
`KVCache` stores floats, so the accuracy is measured by *simulation*: a forward hook on
each attention's ``wqkv`` rounds the k and v parts of its output to that int8 grid before
attention uses them. Keys are rounded before RoPE is applied (RoPE rotates pairs of
channels, which barely changes a per-vector absmax), so this is a close stand-in for a
real int8 cache, not the cache itself.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from labkit.model import ModelConfig


def kv_bytes_per_token(cfg: ModelConfig, kind: str = "fp32") -> int:
    """KV-cache bytes one token holds over all layers: keys + values, for `kind`
    "fp32" (4 B/value), "fp16"/"bf16" (2 B) or "int8" (1 B/value + a 4 B scale per head)."""
    vectors = 2 * cfg.n_layers * cfg.n_kv_heads  # one key and one value vector per head per layer
    per_vector = {"fp32": 4 * cfg.head_dim, "fp16": 2 * cfg.head_dim, "bf16": 2 * cfg.head_dim,
                  "int8": cfg.head_dim + 4}
    if kind not in per_vector:
        raise ValueError(f"KV kind {kind!r} not allowed; choose one of {tuple(per_vector)}")
    return vectors * per_vector[kind]


def sequences_that_fit(cfg: ModelConfig, memory_bytes: float, context: int, kind: str = "fp32") -> int:
    """How many sequences of `context` tokens fit in `memory_bytes` of KV cache."""
    return int(memory_bytes // (kv_bytes_per_token(cfg, kind) * context))


def _round_int8_per_vector(x: torch.Tensor) -> torch.Tensor:
    scale = (x.abs().amax(-1, keepdim=True) / 127).clamp_min(1e-12)
    return torch.round(x / scale).clamp(-127, 127) * scale


@contextlib.contextmanager
def simulated_int8_kv(model: nn.Module):
    """Within this block, `model`'s keys and values are rounded to int8 per token per head."""
    cfg = model.config
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

    def hook(_mod, _args, out):
        qkv = out.unflatten(-1, (H + 2 * Hkv, D))
        kv = _round_int8_per_vector(qkv[..., H:, :])
        return torch.cat((qkv[..., :H, :], kv), dim=-2).flatten(-2)

    handles = [layer.attention.wqkv.register_forward_hook(hook) for layer in model.layers]
    try:
        yield model
    finally:
        for h in handles:
            h.remove()
