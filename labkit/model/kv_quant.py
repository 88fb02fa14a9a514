"""int8 KV-cache storage: one symmetric scale per cached vector (per token, per KV head).

A key or value vector of `head_dim` floats becomes `head_dim` int8 codes plus one fp32
scale = absmax / 127, so a token costs ``head_dim + 4`` bytes per head instead of
``4 · head_dim`` (fp32) or ``2 · head_dim`` (fp16/bf16). Round-to-nearest keeps every
element within scale / 2 of its original value.

Keys are quantized *after* RoPE (the cache holds rotated keys), as int8 KV caches in
serving engines do; a per-vector absmax does not care which channels RoPE mixes.
"""

from __future__ import annotations

import torch

KV_DTYPES = ("model", "int8")  # "model": the model's own dtype (fp32/bf16/fp16)
INT8_SCALE_BYTES = 4  # one fp32 scale per (token, kv head) vector


def check_kv_dtype(kv_dtype: str) -> str:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype {kv_dtype!r} not allowed; choose one of {KV_DTYPES}")
    return kv_dtype


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes (same shape as `x`) and fp32 scales (x.shape[:-1] + (1,)), per last-dim vector."""
    xf = x.float()
    scale = (xf.abs().amax(-1, keepdim=True) / 127).clamp_min(1e-12)  # all-zero vector: any scale works
    return torch.round(xf / scale).clamp_(-127, 127).to(torch.int8), scale


def dequantize_kv(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Back to floats of `dtype` (the multiply runs in fp32, then casts)."""
    return (codes.float() * scale).to(dtype)
