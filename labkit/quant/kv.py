"""KV-cache int8: bytes per token, sequences that fit, and the measured accuracy cost.

The decoder's `KVCache(kv_dtype="int8")` (`labkit.model.kv_quant`) stores each cached key or
value vector (one token, one KV head, `head_dim` values) as int8 codes plus one fp32 scale
(symmetric, per token per head). Perplexity through that cache (`perplexity(...,
kv_dtype="int8")`) is the real cost: every token attends to keys and values read back from
int8 storage.
"""

from __future__ import annotations

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
