"""Decode speed of a (quantized) decoder."""

from __future__ import annotations

import torch

from labkit.timing import measure


def decode_tok_s(model, batch: int = 1, context: int = 32, repeat: int = 5, min_time: float = 0.0,
                 kv_dtype: str = "model") -> float:
    """Decode throughput in tokens/s (all sequences): median time of one `decode_step` at
    `batch` sequences with `context` tokens already cached (in a `kv_dtype` cache: "model"
    or "int8"). Each timed call rewinds the cache by one token, so every call does the same
    work."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (batch, context), generator=g).to(model.device)
    tok = prompt[:, -1]
    cache = model.new_cache(batch, context + 1, kv_dtype=kv_dtype)
    with torch.inference_mode():
        model.prefill(prompt, cache)

        def step():
            cache.lengths.fill_(context)
            cache.filled = context
            model.decode_step(tok, cache)

        t = measure(step, warmup=2, repeat=repeat, min_time=min_time).median
    return batch / t
