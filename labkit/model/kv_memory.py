"""KV-cache memory: one calculator for every decoder shape and KV dtype.

Each token a decoder keeps in its KV cache holds, in every layer, one key and one value
vector of `head_dim` numbers per *KV* head (grouped-query attention shares a KV head
between several query heads; multi-query attention keeps one)::

    bytes per token = 2 · layers · kv_heads · head_dim · bytes per value  (+ int8 scales)

int8 adds one fp32 scale per (token, KV head) vector, for K and for V, which is how
labkit's int8 cache (`labkit.model.kv_quant`) stores it: ``head_dim + 4`` bytes per vector.
fp8 is counted without scales (servers use one scale per tensor or per head: a few bytes
per layer, not per token).

A config can be a `ModelConfig`, a dict (labkit's own
field names or a Hugging Face ``config.json``), or the path of a ``config.json`` (or of
the directory holding it). From an HF config: ``num_hidden_layers``;
``num_key_value_heads`` (default ``num_attention_heads``; ``multi_query`` means 1);
``head_dim`` when given (some models, e.g. Gemma and Qwen3, set it so that
``heads · head_dim != hidden_size``), else ``hidden_size // num_attention_heads``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from labkit import dtypes

KV_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8")  # what a KV value can be stored as (labkit.dtypes names)
SCALE_BYTES = {"int8": 4}  # one fp32 scale per (token, kv head) vector, for K and for V
_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
            "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8"}


@dataclasses.dataclass(frozen=True)
class KVShape:
    """What the KV cache's size depends on: layers, KV heads and head_dim."""

    layers: int
    kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def kv_shape(config: Any) -> KVShape:
    """The `KVShape` of `config` (a ModelConfig, dict, HF config.json or its path)."""
    if isinstance(config, KVShape):
        return config
    if isinstance(config, (str, Path)):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise ValueError(f"no config.json at {str(config)!r}")
        config = json.loads(path.read_text())
    if not isinstance(config, dict):
        config = {f: getattr(config, f) for f in ("n_layers", "layers", "n_kv_heads", "kv_heads",
                                                   "head_dim", "n_heads", "heads", "dim", "d_model")
                  if hasattr(config, f)}
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]  # multimodal HF configs nest the decoder's shape
    return KVShape(*_hf_shape(config)) if "num_hidden_layers" in config or "n_layer" in config \
        else KVShape(*_labkit_shape(config))


def _hf_shape(c: dict) -> tuple[int, int, int]:
    layers = c.get("num_hidden_layers", c.get("n_layer"))
    heads = c.get("num_attention_heads", c.get("n_head"))
    hidden = c.get("hidden_size", c.get("n_embd"))
    if heads is None:
        raise ValueError("HF config needs num_attention_heads")
    kv_heads = 1 if c.get("multi_query") else (c.get("num_key_value_heads") or heads)
    head_dim = c.get("head_dim") or _divide(hidden, heads)
    return layers, kv_heads, head_dim


def _labkit_shape(c: dict) -> tuple[int, int, int]:
    def first(*names):
        return next((c[n] for n in names if c.get(n) is not None), None)

    layers, heads = first("n_layers", "layers"), first("n_heads", "heads")
    kv_heads = first("n_kv_heads", "kv_heads") or heads
    head_dim = first("head_dim") or (_divide(first("dim", "d_model"), heads) if heads else None)
    if layers is None or kv_heads is None or head_dim is None:
        raise ValueError(f"config {sorted(c)} lacks a field: it needs layers (n_layers | layers | "
                         "num_hidden_layers), KV heads (n_kv_heads | kv_heads | num_key_value_heads, or the "
                         "attention heads) and head_dim (or hidden size and heads)")
    return layers, kv_heads, head_dim


def _divide(hidden: int | None, heads: int) -> int:
    if hidden is None or hidden % heads:
        raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads; give head_dim explicitly")
    return hidden // heads


def kv_dtype_name(storage: str | torch.dtype) -> str:
    """Normalise a KV storage type ("fp16", "float16", torch.float16, ...) to one of KV_DTYPES."""
    name = str(storage).removeprefix("torch.").lower() if isinstance(storage, (str, torch.dtype)) else None
    name = _ALIASES.get(name, name)
    if name not in KV_DTYPES:
        raise ValueError(f"KV dtype {storage!r} not allowed; choose one of {KV_DTYPES} "
                         "(or a torch float dtype, or an integer byte count per value)")
    return name


def stored_as(model_dtype: torch.dtype, kv_dtype: str) -> str | torch.dtype:
    """What a run-time KV setting stores per value: `kv_dtype` "model" keeps the model's own
    dtype, "int8" stores int8 codes (with scales). The result is a `storage` for the functions
    below. (Run time names the choice, "model" | "int8"; sizing names what is stored.)"""
    from labkit.model.kv_quant import check_kv_dtype

    return model_dtype if check_kv_dtype(kv_dtype) == "model" else kv_dtype


def kv_bytes_per_token(config: Any, storage: str | torch.dtype | int = "fp16") -> int:
    """KV-cache bytes one token occupies over all layers: keys + values (+ int8 scales).

    `storage`, what each value is stored as: "fp32" | "fp16" | "bf16" | "fp8" | "int8", a
    torch dtype, or an int = bytes per value with no scales (see `stored_as` for a run-time
    KV setting).
    """
    s = kv_shape(config)
    if isinstance(storage, int) and not isinstance(storage, bool):
        if storage < 1:
            raise ValueError(f"bytes per value must be >= 1, got {storage}")
        per_vector = s.head_dim * storage
    else:
        name = kv_dtype_name(storage)
        per_vector = s.head_dim * dtypes.BYTES[name] + SCALE_BYTES.get(name, 0)
    return 2 * s.layers * s.kv_heads * per_vector


def kv_cache_bytes(config: Any, batch: int, context: int, storage: str | torch.dtype | int = "fp16",
                   block_size: int = 1) -> int:
    """Bytes of KV cache for `batch` sequences of `context` tokens each, each sequence's
    slots rounded up to whole blocks of `block_size` tokens (1: exact)."""
    _check_positive(batch=batch, context=context, block_size=block_size)
    slots = -(-context // block_size) * block_size
    return batch * slots * kv_bytes_per_token(config, storage)


def max_concurrent_sequences(config: Any, memory_bytes: float, context: int,
                             storage: str | torch.dtype | int = "fp16", *, weight_bytes: float = 0,
                             utilization: float = 1.0, block_size: int = 1) -> int:
    """How many sequences of `context` tokens fit in the KV memory left beside the weights:
    ``(utilization · memory_bytes − weight_bytes) // bytes per sequence``.

    `utilization` < 1 leaves room for activations and the runtime (vLLM's default
    ``--gpu-memory-utilization`` is 0.9). Returns 0 when the weights leave no room.
    """
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must lie in (0, 1], got {utilization!r}")
    if memory_bytes <= 0 or weight_bytes < 0:
        raise ValueError(f"memory_bytes must be > 0 and weight_bytes >= 0, got {memory_bytes}, {weight_bytes}")
    free = utilization * memory_bytes - weight_bytes
    return max(0, int(free // kv_cache_bytes(config, 1, context, storage, block_size)))


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
