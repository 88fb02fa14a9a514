"""Per-phase dtypes chosen by measurement (`labkit.bench.dtypes`) and the chapter-1 helpers
that give each phase its own model and roof (`labkit.phases`). The differing-dtype path
(prefill bf16, decode fp32: a Xeon with AMX) runs here on tiny shapes: bf16 is slow on this
CPU but correct."""

import dataclasses

import pytest
import torch

from labkit import phases, roofline
from labkit.bench.dtypes import Ceiling, DtypeChoice, pick
from labkit.model import Transformer
from labkit.model.kv_memory import kv_bytes_per_token


def _ceil(dtype: str, phase: str, t: float, error: str = "") -> Ceiling:
    return Ceiling(dtype, phase, {"m": 1, "n": 1, "k": 1}, t, 1 / t, 1 / t, error)


def _choice(bf16_prefill_s: float, bf16_decode_s: float) -> DtypeChoice:
    """fp32 takes 1 s in both phases; bf16 the given times; fp16 did not run."""
    ceilings = [_ceil("fp32", "prefill", 1.0), _ceil("bf16", "prefill", bf16_prefill_s),
                _ceil("fp16", "prefill", float("nan"), "RuntimeError: no kernel"),
                _ceil("fp32", "decode", 1.0), _ceil("bf16", "decode", bf16_decode_s)]
    return DtypeChoice("cpu", ceilings, pick(ceilings, "prefill"), pick(ceilings, "decode"))


@pytest.mark.parametrize("bf16_s, margin, picked", [
    (1 / 1.10, 1.10, "bf16"),   # exactly the margin faster: chosen
    (1 / 1.09, 1.10, "fp32"),   # 9% faster: noise, fp32 kept
    (1 / 0.02, 1.10, "fp32"),   # emulated: 50x slower
    (1 / 1.09, 1.05, "bf16"),   # the same 9% passes a 5% margin
])
def test_pick_takes_bf16_only_when_it_is_margin_faster(bf16_s, margin, picked):
    ceilings = [_ceil("fp32", "decode", 1.0), _ceil("bf16", "decode", bf16_s)]
    assert pick(ceilings, "decode", margin) == picked


def test_reason_says_why_each_phase_got_its_dtype():
    amx = _choice(bf16_prefill_s=1 / 7.4, bf16_decode_s=1 / 0.8)
    assert (amx.prefill, amx.decode) == ("bf16", "fp32")
    assert amx.dtypes() == {"prefill": "bf16", "decode": "fp32"}
    assert amx.reason("prefill") == "prefill: bf16, 7.4x fp32 here, so bf16 runs natively"
    assert amx.reason("decode") == "decode: fp32 (bf16 0.80x fp32 here: slower), so fp32"
    epyc = _choice(bf16_prefill_s=50.0, bf16_decode_s=1 / 1.05)
    assert epyc.reason("prefill") == ("prefill: fp32 (bf16 0.02x fp32 here: emulated; "
                                      "fp16 did not run (RuntimeError: no kernel)), so fp32")
    assert epyc.reason("decode") == "decode: fp32 (bf16 1.05x fp32 here: less than the 10% gain asked), so fp32"
    assert "<- picked" in amx.table()


def _roof(**peaks: float) -> roofline.Roofline:
    return roofline.Roofline("test", peaks, 1e10)


def test_phase_models_give_each_phase_its_dtype_and_copy_only_when_they_differ():
    model = Transformer.from_preset("tiny", n_layers=1, dtype=torch.bfloat16)
    amx = phases.phase_models(model, {"prefill": "bf16", "decode": "fp32"})
    assert amx["prefill"] is model and amx["decode"] is not model
    assert amx["decode"].dtype == torch.float32 and model.dtype == torch.bfloat16  # the original is not cast
    w_bf16, w_fp32 = model.output.weight, amx["decode"].output.weight
    assert torch.equal(w_fp32, w_bf16.float())  # the same weights, widened
    same = phases.phase_models(model, {"prefill": "bf16", "decode": "bf16"})
    assert same["prefill"] is model and same["decode"] is model
    shared = phases.phase_models(model, {"prefill": "fp32", "decode": "fp32"})
    assert shared["prefill"] is shared["decode"] is not model  # one copy for both
    with pytest.raises(ValueError, match="dtype 'int4' of phase 'decode'"):
        phases.phase_models(model, {"decode": "int4"})


def test_each_phase_is_timed_and_predicted_in_its_own_dtype():
    """The chapter-1 path for prefill bf16 / decode fp32, on a 1-layer tiny model."""
    dt = {"prefill": "bf16", "decode": "fp32"}
    roof = _roof(bf16=4e10, fp32=1e10)
    models = phases.phase_models(Transformer.from_preset("tiny", n_layers=1, dtype=torch.bfloat16), dt)
    pre = phases.time_prefill(models["prefill"], [8], roof, repeat=1, dtype=dt["prefill"])
    dec = phases.time_decode(models["decode"], [1], [8], roof, steps=2, repeat=1, dtype=dt["decode"])
    cfg = models["prefill"].config
    # the analytic bytes and roof follow each phase's dtype: bf16 prefill moves half of fp32's bytes
    fp32_pre = phases.analytic(cfg, roof, "prefill", seq_len=8, dtype="fp32")
    assert pre[0]["bytes"] == pytest.approx(fp32_pre["bytes"] / 2, rel=0.01)
    assert dec[0]["bytes"] == phases.analytic(cfg, roof, "decode", batch=1, context=9, dtype="fp32")["bytes"]
    kv = kv_bytes_per_token(cfg, torch.float32)  # decode's cache is fp32, like its model
    assert dec[0]["bytes_per_step"] == models["decode"].weight_bytes_per_step() + 9 * kv  # 8 + steps // 2 tokens
    pts, labels = phases.roofline_points(pre, dec, dt["prefill"], dt["decode"])
    assert [(p.name, p.dtype) for p in pts] == [("prefill", "bf16"), ("decode", "fp32")]
    assert [p.dtype for p in phases.roofline_points(pre, dec, "fp32")[0]] == ["fp32", "fp32"]


def test_measure_rooflines_measures_each_distinct_dtype_once(monkeypatch):
    calls = []

    def fake(device, dtype, **kw):
        calls.append((dtype, kw))
        return dataclasses.replace(_roof(**{dtype: {"fp32": 1e10, "bf16": 7e10}[dtype]}),
                                   bandwidth={"fp32": 2e10, "bf16": 2.2e10}[dtype])

    monkeypatch.setattr(phases, "measure_roofline", fake)
    roof = phases.measure_rooflines("cpu", ["bf16", "fp32"], gemm_n=32)
    assert roof.peaks == {"bf16": 7e10, "fp32": 1e10} and roof.bandwidth == 2.2e10  # the best STREAM run
    assert calls == [("bf16", {"gemm_n": 32}), ("fp32", {"gemm_n": 32})]
    calls.clear()
    assert phases.measure_rooflines("cpu", ["fp32", "fp32"]).peaks == {"fp32": 1e10} and len(calls) == 1
    with pytest.raises(ValueError, match="dtypes is empty"):
        phases.measure_rooflines("cpu", [])


def test_measure_rooflines_runs_for_real_on_tiny_sizes():
    roof = phases.measure_rooflines("cpu", ["bf16", "fp32"], gemm_n=32, llc_multiple=0.01)
    assert set(roof.peaks) == {"bf16", "fp32"} and roof.bandwidth > 0
    assert roof.ridge("bf16") == roof.peak("bf16") / roof.bandwidth


def test_a_dtype_far_slower_than_fp32_on_its_first_run_is_not_repeated(monkeypatch):
    from labkit.bench import dtypes

    seconds = {"fp32": 1.0, "bf16": 0.5, "fp16": 50.0}  # bf16 native (2x), fp16 emulated
    calls = []

    def fake(dtype, phase, device="cpu", *, repeat=5, **kw):
        calls.append((dtype, phase, repeat))
        return _ceil(dtype, phase, seconds[dtype])

    monkeypatch.setattr(dtypes, "measure_ceiling", fake)
    choice = dtypes.choose_dtypes("cpu", repeat=5)
    assert (choice.prefill, choice.decode) == ("bf16", "bf16")
    assert [(c.dtype, c.phase) for c in choice.ceilings] == [(d, p) for p in dtypes.PHASES for d in dtypes.DTYPES]
    for phase in dtypes.PHASES:  # fp32 timed fully, bf16 screened then timed fully, fp16 screened only
        assert [c for c in calls if c[1] == phase] == [("fp32", phase, 5), ("bf16", phase, 1), ("bf16", phase, 5),
                                                       ("fp16", phase, 1)]
