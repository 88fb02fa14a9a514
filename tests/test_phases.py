"""Chapter 1's measurement helpers: analytic intensities and timing rows (the C1/C2 verdicts:
tests/test_ledger_ch12.py)."""

from __future__ import annotations

import pytest

from labkit import phases, roofline
from labkit.model import Transformer, get_config

ROOF = roofline.Roofline("toy", {"fp32": 200e9}, 20e9)  # ridge 10 FLOP/B


@pytest.fixture(scope="module")
def model():
    return Transformer.from_preset("tiny", n_layers=1, dim=64, n_heads=4, n_kv_heads=2, hidden_dim=128,
                                   max_seq_len=256)


def test_intensity_prefill_grows_with_prompt_decode_with_batch():
    cfg = get_config("tiny")
    pre = [phases.analytic(cfg, ROOF, "prefill", seq_len=T)["intensity"] for T in (8, 64, 256)]
    dec = [phases.analytic(cfg, ROOF, "decode", batch=B, context=64)["intensity"] for B in (1, 8)]
    assert pre == sorted(pre) and dec == sorted(dec)
    assert dec[0] < 1 < ROOF.ridge() < pre[-1]  # fp32 GEMV: ~0.5 FLOP/B; long prefill: far above


def test_timing_rows(model):
    pre = phases.time_prefill(model, [8, 32], ROOF, repeat=1)
    dec = phases.time_decode(model, [1, 2], [16], ROOF, steps=2, repeat=1)
    assert [r["prompt_len"] for r in pre] == [8, 32] and all(r["seconds"] > 0 for r in pre)
    assert [(r["batch"], r["context"]) for r in dec] == [(1, 16), (2, 16)]
    # bytes per step: all weights + the KV cache of every sequence, so more with the batch
    assert dec[0]["bytes_per_step"] >= model.weight_bytes_per_step(1)
    assert dec[1]["bytes_per_step"] > dec[0]["bytes_per_step"]
    kv = phases.cache_vs_nocache(model, 8, 6)
    assert kv["cache_s"] > 0 and kv["speedup"] == pytest.approx(kv["nocache_s"] / kv["cache_s"])
