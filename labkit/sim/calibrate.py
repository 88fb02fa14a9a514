"""Calibrate a cost model on this machine: time the decoder's steps, fit `LinearCost`.

`measure_decoder` sweeps decode batches × context lengths and prompt lengths on
`labkit.model` and returns rows (decode_batch, prefill_tokens, context_tokens, seconds);
`calibrate` fits them and saves the model with its rows as JSON. The decoder runs
prefill and decode as separate calls, so the rows are pure-decode or pure-prefill steps;
the fitted model adds the two terms for a mixed step.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any, Sequence

from labkit.sim import cost as _cost


def measure_decoder(model: Any = None, *, batches: Sequence[int] = (1, 4, 16), contexts: Sequence[int] = (32, 256),
                    prompts: Sequence[int] = (32, 128, 512), repeat: int = 5,
                    device: str | None = None) -> list[tuple[int, int, int, float]]:
    """Median step times (s) of the decoder `model` (default: `labkit.model` preset "tiny",
    random weights; timing does not depend on their values)."""
    import torch

    from labkit import timing
    from labkit.model import Transformer

    model = model or Transformer.from_preset("tiny", device=device or "cpu")
    dev, vocab = model.device, model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    rows: list[tuple[int, int, int, float]] = []
    with torch.inference_mode():
        for b in batches:
            for c in contexts:
                cache = model.new_cache(b, c + repeat + 8)
                model.prefill(torch.randint(vocab, (b, c), generator=gen).to(dev), cache)
                tok = torch.randint(vocab, (b,), generator=gen).to(dev)
                st = timing.measure(lambda: model.decode_step(tok, cache), warmup=2, repeat=repeat,
                                    max_repeat=repeat, device=dev)
                rows.append((b, 0, b * c, st.median))
        for p in prompts:
            cache = model.new_cache(1, p)
            toks = torch.randint(vocab, (1, p), generator=gen).to(dev)

            def run() -> None:
                cache.reset()
                model.prefill(toks, cache)
            rows.append((0, p, p, timing.measure(run, warmup=1, repeat=repeat, device=dev).median))
    return rows


def calibrate(path: str | Path | None = None, rows: Sequence[Sequence[float]] | None = None,
              **measure_kw: Any) -> _cost.LinearCost:
    """Fit a `LinearCost` to `rows` (measured now with `measure_decoder` if None); save it
    with the rows and the machine name to `path` (JSON) if given."""
    rows = list(rows) if rows is not None else measure_decoder(**measure_kw)
    model = _cost.LinearCost.fit(rows, name="fitted", source=f"decoder step times on {platform.node() or 'this machine'}")
    if path is not None:
        _cost.save(model, path, rows=[list(map(float, r)) for r in rows],
                   max_rel_error=float(abs(model.residuals(rows)).max()))
    return model
