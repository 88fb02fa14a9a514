"""Model shapes: the `ModelConfig` dataclass and its named presets.

A preset is only a shape. `tiny` is the shape of the shipped, trained checkpoint
(data/tiny/); the others are random-initialised and exist for speed work, shaped
like well-known models so their bytes and FLOPs per token are realistic:

* ``tiny``  ~4.2 M params (16.8 MB fp32), vocab 4096 (the workbook's tokenizer), trained on CPU;
* ``small`` ~100 M params (GPT-2-small-like width, Llama layout, GQA);
* ``1b``    TinyLlama-1.1B-shaped (22 layers, d=2048, GQA 32/4);
* ``7b``    Llama-2-7B-shaped (32 layers, d=4096, MHA);
* ``8b``    Llama-3-8B-shaped (32 layers, d=4096, GQA 32/8, vocab 128256).

These are the shapes the roofline (`labkit.roofline.layer_costs`), the KV calculator and the
simulator's roofline cost read: one `ModelConfig`, no second shape type.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class ModelConfig:
    """Shape of a Llama-architecture decoder.

    `n_kv_heads` < `n_heads` gives grouped-query attention (it must divide `n_heads`).
    `head_dim` defaults to ``dim // n_heads`` but may be set explicitly (some HF
    checkpoints use head_dim * n_heads != dim). `max_seq_len` is the context in
    tokens: the longest prompt + generation the model accepts.

    `qkv_bias`: the q, k and v projections carry biases (Qwen2; the output projection
    never does). `rope_scaling`: None (plain RoPE) or Llama 3.1's frequency scaling,
    ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`` (see `labkit.model.transformer.rope_inv_freq`).
    """

    vocab_size: int = 4096
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int | None = None
    head_dim: int | None = None
    hidden_dim: int = 688
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    qkv_bias: bool = False
    rope_scaling: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        check_rope_scaling(self.rope_scaling)
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ValueError(f"dim={self.dim} is not divisible by n_heads={self.n_heads}; "
                                 "set head_dim explicitly")
            self.head_dim = self.dim // self.n_heads
        if not 1 <= self.n_kv_heads <= self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} "
                             f"and lie in [1, {self.n_heads}]")
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")

    @property
    def n_rep(self) -> int:
        """Query heads per KV head (1 = multi-head attention)."""
        return self.n_heads // self.n_kv_heads

    def num_params(self) -> int:
        """Parameter count (tied embeddings counted once)."""
        d, hd = self.dim, self.head_dim
        attn = d * hd * (self.n_heads + 2 * self.n_kv_heads) + self.n_heads * hd * d
        if self.qkv_bias:
            attn += hd * (self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * d * self.hidden_dim
        per_layer = attn + mlp + 2 * d
        emb = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.n_layers * per_layer + emb + d

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}; known: {sorted(fields)}")
        return cls(**d)


ROPE_TYPES = ("default", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def check_rope_scaling(scaling: dict[str, Any] | None) -> None:
    """Raise ValueError unless `scaling` is None or a complete, sane llama3 RoPE scaling dict."""
    if scaling is None:
        return
    if not isinstance(scaling, dict) or scaling.get("rope_type") != "llama3":
        kind = scaling.get("rope_type") if isinstance(scaling, dict) else scaling
        raise ValueError(f"rope_scaling {kind!r} not supported; labkit implements None (plain RoPE) "
                         f"or rope_type 'llama3'")
    missing = [k for k in LLAMA3_KEYS if k not in scaling]
    if missing:
        raise ValueError(f"llama3 rope_scaling lacks {missing}; it needs {list(LLAMA3_KEYS)}")
    if not (scaling["factor"] > 0 and scaling["original_max_position_embeddings"] > 0):
        raise ValueError(f"llama3 rope_scaling needs factor > 0 and original_max_position_embeddings > 0, "
                         f"got {scaling['factor']!r} and {scaling['original_max_position_embeddings']!r}")
    if not 0 < scaling["low_freq_factor"] < scaling["high_freq_factor"]:
        raise ValueError(f"llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor, got "
                         f"{scaling['low_freq_factor']!r} and {scaling['high_freq_factor']!r}")


PRESETS: dict[str, dict[str, Any]] = {
    # Trained on 2 CPU cores in ~10 min (labkit.train); 256-token training windows.
    "tiny": dict(vocab_size=4096, dim=256, n_layers=4, n_heads=8, n_kv_heads=4,
                 hidden_dim=768, max_seq_len=1024, tie_embeddings=True),
    "small": dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=4,
                  hidden_dim=2048, max_seq_len=2048, tie_embeddings=True),
    "1b": dict(vocab_size=32000, dim=2048, n_layers=22, n_heads=32, n_kv_heads=4,
               hidden_dim=5632, max_seq_len=2048, norm_eps=1e-5, tie_embeddings=False),
    "7b": dict(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32,
               hidden_dim=11008, max_seq_len=4096, norm_eps=1e-5, tie_embeddings=False),
    "8b": dict(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
               hidden_dim=14336, max_seq_len=8192, rope_theta=500000.0, norm_eps=1e-5, tie_embeddings=False),
}


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The `ModelConfig` of preset `name`, with optional field overrides.

    Raises ValueError naming the allowed presets for an unknown name.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of "
                         f"{', '.join(map(repr, PRESETS))}")
    return ModelConfig(**{**PRESETS[name], **overrides})
