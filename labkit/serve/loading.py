"""What both server processes need before any serving starts: the model to serve
(`load_model`, `check_model`) and a child process that dies with its parent
(`die_with_parent`). Below `server` and `core`, so neither imports the other for these."""

from __future__ import annotations

import ctypes
import json
import signal
from typing import Any

from labkit.paths import TINY


def load_model(preset: str, device: str = "auto", quantize: str | None = None) -> Any:
    """The decoder to serve: the trained checkpoint for "tiny", random weights otherwise;
    with `quantize` (a labkit.quant scheme) its linear layers' weights quantized."""
    from labkit.device import pick
    from labkit.model import Transformer, load_tiny

    dev = pick(device)
    if preset == "tiny":
        model = load_tiny(device=dev).eval()
    else:
        print(f"labkit serve: preset {preset!r} has no trained checkpoint; serving random weights "
              "(speed work only, the text is noise)", flush=True)
        model = Transformer.from_preset(preset, device=dev)
    if quantize is not None:
        from labkit.quant.linear import quantize_model

        model = quantize_model(model, quantize, inplace=True)
    return model


def trained_context() -> int | None:
    """Sequence length the shipped tiny checkpoint was trained at (tokens), from data/tiny."""
    try:
        return json.loads((TINY / "config.json").read_text())["training"]["seq_len"]
    except (OSError, KeyError, ValueError):
        return None


def check_model(model: Any, preset: str, max_model_len: int) -> None:
    """ValueError if `model` cannot serve `max_model_len` tokens; a note if the tiny checkpoint was
    trained on fewer."""
    if max_model_len > model.config.max_seq_len:
        raise ValueError(f"max_model_len {max_model_len} exceeds the {preset} model's context "
                         f"({model.config.max_seq_len} tokens); allowed 1..{model.config.max_seq_len}")
    ctx = trained_context() if preset == "tiny" else None
    if ctx and max_model_len > ctx:
        print(f"labkit serve: max_model_len {max_model_len} is past the {ctx}-token context the tiny "
              "checkpoint was trained at; RoPE runs there, but text quality drops", flush=True)


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the process that started it dies (a notebook
    kernel killed mid-cell must not leave a server behind). Linux only (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass
