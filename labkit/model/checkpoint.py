"""Checkpoint I/O: labkit's own format and local Hugging Face Llama directories.

labkit format: a directory with ``model.safetensors`` (labkit parameter names, a tied
embedding stored once) and ``config.json`` (the `ModelConfig` fields plus
``"format": "labkit"``).

HF format: ``config.json`` (``model_type`` llama-like) + ``*.safetensors``, sharded or
not. HF Llama applies RoPE with the rotate-half convention, which is what labkit
implements, so q/k weights load without any permutation; only q/k/v and gate/up are
concatenated into labkit's fused ``wqkv`` and ``w13``. transformers is never imported.

Supported beyond plain Llama: Llama 3.1's ``llama3`` RoPE frequency scaling, and Qwen2
(``model_type: qwen2``: biases on q, k and v). Anything else that would change the maths
(other RoPE types, an output-projection or MLP bias, sliding-window attention, another
activation) is refused with a ValueError rather than loaded into a model that differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from labkit.model.config import LLAMA3_KEYS, ModelConfig, check_rope_scaling
from labkit.model.transformer import INFERENCE_LAYOUT, Transformer
from labkit.paths import TINY as TINY_DIR  # the name labkit.benches.model and others import

FORMAT = "labkit"
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def save_checkpoint(model: Transformer, path: str | Path, extra: dict | None = None) -> Path:
    """Write `model` to directory `path` (created if needed) in labkit format."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("output.weight", None)  # same storage as tok_embeddings; safetensors forbids sharing
    save_file(state, str(path / "model.safetensors"), metadata={"format": FORMAT})
    meta = {"format": FORMAT, **model.config.to_dict(), **(extra or {})}
    (path / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_checkpoint(path: str | Path, *, dtype: torch.dtype | None = None,
                    device: torch.device | str = "cpu") -> Transformer:
    """Load a labkit-format directory or a local HF Llama directory (auto-detected)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    meta = json.loads(cfg_file.read_text())
    if meta.get("format") != FORMAT:
        return load_hf_llama(path, dtype=dtype, device=device)
    fields = {k: v for k, v in meta.items() if k in ModelConfig.__dataclass_fields__}
    model = Transformer(ModelConfig.from_dict(fields))
    state = _read_safetensors([path / "model.safetensors"])
    if model.config.tie_embeddings:
        state["output.weight"] = state["tok_embeddings.weight"]
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype or model.dtype).eval().set_weight_layout(INFERENCE_LAYOUT)


def _read_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():
                out[k] = fh.get_tensor(k)
    return out


def hf_rope(hf: dict) -> tuple[float, dict | None]:
    """(rope_theta, labkit `rope_scaling`) from an HF config dict, old or new layout.

    transformers >= 5 nests RoPE settings in ``rope_parameters``; older configs keep
    ``rope_theta`` at the top and scaling in ``rope_scaling`` (``type`` in the oldest).
    Raises ValueError for a RoPE type labkit does not implement."""
    rope = dict(hf.get("rope_scaling") or {})
    rope.update(hf.get("rope_parameters") or {})
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"RoPE type {rope_type!r} not supported; labkit implements 'default' and 'llama3'")
    scaling = {"rope_type": "llama3", **{k: rope[k] for k in LLAMA3_KEYS if k in rope}}
    scaling.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    check_rope_scaling(scaling)
    return theta, scaling


def hf_qkv_bias(hf: dict) -> bool:
    """Whether q/k/v carry biases: always for Qwen2, never for Llama. Raises ValueError for
    biases labkit does not implement (Llama's attention_bias also biases the output
    projection; mlp_bias)."""
    if hf.get("mlp_bias"):
        raise ValueError("mlp_bias checkpoints are not supported (labkit's MLP has no biases)")
    if hf.get("model_type") == "qwen2":
        return True
    if hf.get("attention_bias"):
        raise ValueError("attention_bias checkpoints (bias on q, k, v and o) are not supported; labkit "
                         "implements q/k/v biases only, as in Qwen2 (model_type 'qwen2')")
    return False


def hf_config_to_labkit(hf: dict) -> ModelConfig:
    """Translate an HF Llama or Qwen2 config.json dict into a `ModelConfig`.

    Raises ValueError for features labkit does not implement (an o or MLP bias, non-SiLU
    MLP, RoPE types other than default/llama3, sliding-window attention), rather than
    loading a model that would silently differ.
    """
    model_type = hf.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} not supported; choose one of {', '.join(SUPPORTED_MODEL_TYPES)}")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf['hidden_act']!r} not supported; labkit implements 'silu'")
    if hf.get("use_sliding_window"):
        raise ValueError("use_sliding_window=True not supported; labkit attends over the whole context")
    theta, scaling = hf_rope(hf)
    n_heads = hf["num_attention_heads"]
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        dim=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
        hidden_dim=hf["intermediate_size"],
        max_seq_len=hf.get("max_position_embeddings", 2048),
        rope_theta=theta,
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=hf_qkv_bias(hf),
        rope_scaling=scaling,
    )


def load_hf_llama(path: str | Path, *, dtype: torch.dtype | None = None,
                  device: torch.device | str = "cpu") -> Transformer:
    """Load a local HF Llama-architecture directory (config.json + *.safetensors).

    `dtype` defaults to the checkpoint's ``torch_dtype``/``dtype`` (fp32 if absent).
    """
    path = Path(path)
    hf = json.loads((path / "config.json").read_text())
    cfg = hf_config_to_labkit(hf)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    src = _read_safetensors(files)
    if dtype is None:
        name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
        dtype = getattr(torch, name, torch.float32)
    with torch.device("meta"):
        model = Transformer(cfg)
    state: dict[str, torch.Tensor] = {"tok_embeddings.weight": src["model.embed_tokens.weight"],
                                      "norm.weight": src["model.norm.weight"]}
    state["output.weight"] = state["tok_embeddings.weight"] if cfg.tie_embeddings \
        else src["lm_head.weight"]
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        state[f"layers.{i}.attention.wqkv.weight"] = torch.cat(
            [src[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        if cfg.qkv_bias:
            state[f"layers.{i}.attention.wqkv.bias"] = torch.cat([src[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
        state[f"layers.{i}.attention.wo.weight"] = src[p + "self_attn.o_proj.weight"]
        state[f"layers.{i}.feed_forward.w13.weight"] = torch.cat(
            [src[p + "mlp.gate_proj.weight"], src[p + "mlp.up_proj.weight"]])
        state[f"layers.{i}.feed_forward.w2.weight"] = src[p + "mlp.down_proj.weight"]
        state[f"layers.{i}.attention_norm.weight"] = src[p + "input_layernorm.weight"]
        state[f"layers.{i}.ffn_norm.weight"] = src[p + "post_attention_layernorm.weight"]
    state = {k: v.to(dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight  # assign=True replaced the shared Parameter
    model.init_rope()  # the RoPE buffers were created on the meta device; rebuild them for real
    return model.to(device).eval().set_weight_layout(INFERENCE_LAYOUT)


def load_tiny(device: torch.device | str = "cpu") -> Transformer:
    """The shipped, trained tiny checkpoint (data/tiny/); its tokenizer comes from
    `labkit.tokenizer.load_tokenizer()`."""
    if not (TINY_DIR / "model.safetensors").is_file():
        raise FileNotFoundError(f"{TINY_DIR}/model.safetensors is missing; "
                                "recreate it with `python -m labkit.train`")
    return load_checkpoint(TINY_DIR, device=device)
