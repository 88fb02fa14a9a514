"""KV-cache int8: bytes per token, sequences that fit, and the measured accuracy cost.

The decoder's `KVCache(kv_dtype="int8")` (`labkit.model.kv_quant`) stores each cached key or
value vector (one token, one KV head, `head_dim` values) as int8 codes plus one fp32 scale
(symmetric, per token per head). Perplexity through that cache (`perplexity(...,
kv_dtype="int8")`) is the real cost: every token attends to keys and values read back from
int8 storage.
"""

from __future__ import annotations

from labkit.model import ModelConfig, kv_memory


def kv_bytes_per_token(cfg: ModelConfig, kind: str = "fp32") -> int:
    """KV-cache bytes one token holds over all layers: keys + values, for `kind`
    "fp32" (4 B/value), "fp16"/"bf16" (2 B) or "int8" (1 B/value + a 4 B scale per head)
    (`labkit.model.kv_memory`, which also takes "fp8" and torch dtypes)."""
    return kv_memory.kv_bytes_per_token(cfg, kind)


def sequences_that_fit(cfg: ModelConfig, memory_bytes: float, context: int, kind: str = "fp32") -> int:
    """How many sequences of `context` tokens fit in `memory_bytes` of KV cache."""
    return kv_memory.max_concurrent_sequences(cfg, memory_bytes, context, kind)
