"""Judges of C6-C14 on synthetic measurements (each made to hold and to fail, and
inconclusive where a machine can make it so), predictions from shapes, and the cheap
measurements on tiny sizes. Nothing here depends on how fast this machine is."""

import pytest

from labkit.ledger import FAILS, HOLDS, INCONCLUSIVE, ch3, ch4
from labkit.fusion import experiments as fx
from labkit.model import Transformer


# ------------------------------------------------------------------------------- C6
def test_c6_holds_and_fails():
    p = ch3.predict_c6(1000, 2e-6)
    assert p.values["predicted"].value == pytest.approx(2.0)  # ms
    assert ch3.judge_c6(p, 1000, 2.6e-3).outcome == HOLDS
    v = ch3.judge_c6(p, 1000, 8e-3)  # the ops' own work dominates: overhead only 25 %
    assert v.outcome == FAILS and "25%" in v.reason
    assert ch3.judge_c6(p, 1000, 0.5e-3).outcome == FAILS  # 4x faster than ops x cost: model wrong
    with pytest.raises(ValueError, match="n_ops"):
        ch3.predict_c6(0, 1e-6)


def test_c6_on_a_model_step_with_a_fitted_fixed_cost():
    # a smoke run on a 2-core VM: intercept 1.72 µs (R^2 0.997), 214 ops in a tiny-decoder step of 1.70 ms
    fit = {"intercept_s": 1.72e-6, "slope_s_per_element": 2.8e-10, "r2": 0.997}
    p = ch3.predict_c6(214, fit["intercept_s"])
    v = ch3.judge_c6(p, 214, 1.70e-3, fit)
    assert v.outcome == FAILS and "22%" in v.reason           # the decoder's own work dominates here
    assert ch3.judge_c6(p, 214, 0.60e-3, fit).outcome == HOLDS  # a machine where its matmuls are fast
    noisy = dict(fit, r2=0.4)                                   # time did not grow with work: no intercept to trust
    assert ch3.judge_c6(p, 214, 1.70e-3, noisy).outcome == INCONCLUSIVE


def test_c6_fit_and_step_measure_on_this_machine(one_thread):
    from labkit.model import Transformer

    fit = fx.fixed_cost_fit("cpu", widths=(16, 4096, 65536), ops=20, rounds=1)
    assert set(fit["per_op_s"]) == {16, 4096, 65536} and fit["slope_s_per_element"] > 0
    step = fx.decode_step(Transformer.from_preset("tiny"), 8)
    assert fx.count_step_ops(step) > 50 and fx.measure_c6_step(step, repeat=3) > 0


# ------------------------------------------------------------------------------- C7
def _chain(nodes, eager_k, fused_k, eager_s, fused_s):
    return {"aten_nodes": nodes, "eager_kernels": eager_k, "fused_kernels": fused_k, "eager_s": eager_s,
            "fused_s": fused_s}


def test_c7_holds_fails_both_sides_and_inconclusive():
    p = ch3.predict_c7(2**22)
    assert p.values["bias_gelu_residual bytes cut"].value == pytest.approx(100 * 4 / 7)
    ok = {"a": _chain(7, 3, 1, 10.0, 7.0), "b": _chain(7, 8, 1, 10.0, 7.0)}
    v = ch3.judge_c7(p, ok)
    assert v.outcome == HOLDS and v.evidence["distance from 20-40%"].value == 0
    short = {"a": _chain(7, 3, 1, 10.0, 9.5), "b": _chain(7, 8, 1, 10.0, 9.5)}
    v = ch3.judge_c7(p, short)
    assert v.outcome == FAILS and "short" in v.reason and v.evidence["distance from 20-40%"].value == pytest.approx(-15)
    more = {"a": _chain(7, 3, 1, 10.0, 2.0), "b": _chain(7, 8, 1, 10.0, 2.0)}
    assert "more than" in ch3.judge_c7(p, more).reason
    few_nodes = {"a": _chain(4, 3, 2, 10.0, 7.0), "b": _chain(7, 8, 1, 10.0, 7.0)}
    assert ch3.judge_c7(p, few_nodes).outcome == FAILS
    v = ch3.judge_c7(p, None, "torch.compile did not work here (no C++ compiler)")
    assert v.outcome == INCONCLUSIVE and "compiler" in v.reason


# ------------------------------------------------------------------------------- C8
def test_c8_holds_fails_and_inconclusive():
    p = ch3.predict_c8()
    assert ch3.judge_c8(p, 1e-6, 3, 1).outcome == HOLDS
    assert ch3.judge_c8(p, 0.3, 3, 1).outcome == FAILS        # a wrong fold
    assert ch3.judge_c8(p, 1e-6, 3, 2).outcome == FAILS       # two ops left
    assert ch3.judge_c8(p, 1e-6, 3, 2, fused_act=False).outcome == INCONCLUSIVE


def test_c8_measure_folds_to_one_op_on_cpu():
    m = fx.measure_c8(batch=2, channels=8, hw=12, inputs=2)
    assert m["max_rel_error"] < 1e-4
    assert m["unfolded_ops"] == 3
    assert m["folded_ops"] == (1 if m["fused_act"] else 2)


# ------------------------------------------------------------------------------- C9
def test_c9_prediction_from_shape_and_judge():
    cfg = Transformer.from_preset("small", n_layers=2).config
    p = ch3.predict_c9(cfg, 1, 128)
    assert p.values["saved (train)"].value > p.values["live (inference)"].value
    assert ch3.judge_c9(p, {"train": 32 * 2**20, "inference_mode": 16 * 2**20}).outcome == HOLDS
    assert ch3.judge_c9(p, {"train": 20 * 2**20, "inference_mode": 16 * 2**20}).outcome == FAILS


# ------------------------------------------------------------------------------- C10
def _c10_rows(int8_speedup):
    return [{"scheme": "fp32", "speedup_b1": 1.0, "predicted_speedup": 1.0},
            {"scheme": "fp16", "speedup_b1": 0.2, "predicted_speedup": 2.0},
            {"scheme": "int8 (a)", "speedup_b1": int8_speedup, "predicted_speedup": 3.98},
            {"scheme": "int8 (b)", "speedup_b1": 1.1, "predicted_speedup": 3.98}]


def test_c10_prediction_shows_quarter_and_half():
    p = ch4.predict_c10({"fp32": 400.0, "fp16": 200.0, "int8 (a)": 100.5})
    assert p.values["bytes int8/fp32"].value == pytest.approx(0.25, abs=0.01)
    assert p.values["bytes int8/fp16"].value == pytest.approx(0.5, abs=0.01)
    assert "quarter" in p.statement


def test_c10_holds_and_fails():
    p = ch4.predict_c10({"fp32": 400.0, "fp16": 200.0, "int8 (a)": 100.5})
    assert ch4.judge_c10(p, _c10_rows(3.0)).outcome == HOLDS
    v = ch4.judge_c10(p, _c10_rows(1.5))  # 38 % of the bytes-predicted gain
    assert v.outcome == FAILS and "not what sets" in v.reason
    assert ch4.judge_c10(p, _c10_rows(7.0)).outcome == FAILS  # more than bytes can explain
    with pytest.raises(ValueError, match="int8"):
        ch4.judge_c10(p, _c10_rows(3.0)[:2])


# ------------------------------------------------------------------------------- C11
def _c11(int4=40.0, w8a8=36.0, clip=35.5, smooth=33.6, mixed=33.5, planted=60.0):
    """`c11_perplexities`' figures: the model's own W8A8 runs ("own ...") and the planted demonstration."""
    return {"fp32": 33.0, "int8 (int8pack_mm)": 33.05, "int4-g128 (int4pack_mm)": int4, "int4-g32 (int4pack_mm)": 33.3,
            "own W8A8 minmax": w8a8, "clean W8A8 minmax": w8a8, "own W8A8 p99.9": clip,
            "own SmoothQuant a=0.5": smooth, "own W8A8 mixed (measured)": mixed,
            "outliers fp32": 33.0, "outliers int8 weight-only": 33.05, "outliers W8A8 minmax": planted,
            "outliers W8A8 p99.9": 45.0, "outliers SmoothQuant a=0.5": 34.0, "outliers W8A8 mixed (measured)": 34.0}


def test_c11_holds_and_each_part_can_fail():
    p = ch4.predict_c11(100.0)
    v = ch4.judge_c11(p, _c11(), kept=6, own_kept=2)
    assert v.outcome == HOLDS and v.evidence["demonstration, planted outliers: W8A8"].value == pytest.approx(81.8, 0.01)
    v = ch4.judge_c11(p, _c11(int4=33.4))
    assert v.outcome == FAILS and "int4" in v.reason                       # 4-bit did not break
    # a smoke run's shape: the trained model's own activations cost W8A8 +0.6 %, int8 weights +0.15 %;
    # the planted x100 outliers still break W8A8 (+82 %), but the demonstration decides nothing
    v = ch4.judge_c11(p, _c11(w8a8=33.2, clip=33.2, smooth=33.1, mixed=33.1, planted=60.0))
    assert v.outcome == FAILS and "own activations" in v.reason
    assert "calibration" in ch4.judge_c11(p, _c11(clip=36.0, smooth=36.0)).reason  # no calibration repair
    assert "mixed" in ch4.judge_c11(p, _c11(mixed=36.0)).reason                    # no mixed-precision repair
    with pytest.raises(ValueError, match="own W8A8"):
        ch4.judge_c11(p, {k: v for k, v in _c11().items() if not k.startswith("own")})


def test_sensitive_layers_come_from_the_scan():
    from labkit.quant.experiments import sensitive_layers

    scan = [{"layer": "a", "dppl_pct": 9.0}, {"layer": "b", "dppl_pct": 1.5}, {"layer": "c", "dppl_pct": 0.2}]
    assert sensitive_layers(scan, 1.0) == ["a", "b"]
    with pytest.raises(ValueError, match="threshold_pct"):
        sensitive_layers(scan, 0)


# ------------------------------------------------------------------------------- C12
def test_c12_prediction_and_judge():
    cfg = Transformer.from_preset("small", n_layers=4, vocab_size=4096).config
    p = ch4.predict_c12(cfg, 0.5)
    assert 1.5 < p.values["structured"].value < 2.0 and p.values["CSR"].value == pytest.approx(1.0)
    assert ch4.judge_c12(p, 1.0, 0.6, 1.7).outcome == HOLDS
    assert ch4.judge_c12(p, 1.3, 0.6, 1.7).outcome == FAILS   # zeros kept dense got faster
    assert ch4.judge_c12(p, 1.0, 1.4, 1.7).outcome == FAILS   # CSR got faster
    assert ch4.judge_c12(p, 1.0, 0.6, 1.1).outcome == FAILS   # structured did not pay
    with pytest.raises(ValueError, match="sparsity"):
        ch4.predict_c12(cfg, 1.0)


# ------------------------------------------------------------------------------- C13
def test_c13_holds_ties_and_fails():
    p = ch4.predict_c13(["D→P→Q", "P→D→Q", "Q→D→P→Q"])
    assert ch4.judge_c13(p, {"D→P→Q": 50.0, "P→D→Q": 60.0, "Q→D→P→Q": 55.0}).outcome == HOLDS
    v = ch4.judge_c13(p, {"D→P→Q": 50.5, "P→D→Q": 50.0, "Q→D→P→Q": 55.0})
    assert v.outcome == HOLDS and "tie" in v.reason
    v = ch4.judge_c13(p, {"D→P→Q": 60.0, "P→D→Q": 50.0, "Q→D→P→Q": 55.0})
    assert v.outcome == FAILS and "P→D→Q" in v.reason
    with pytest.raises(ValueError, match="claimed"):
        ch4.judge_c13(p, {"P→D→Q": 50.0})


# ------------------------------------------------------------------------------- C14
def test_c14_holds_fails_and_inconclusive():
    tiny = Transformer.from_preset("tiny").config
    student = Transformer.from_preset("tiny", n_layers=2).config
    p = ch4.predict_c14(tiny, student, 64)
    assert 1.3 < p.values["training FLOP ratio"].value < 2.0
    assert ch4.judge_c14(p, 1.0, 2.0, 1.3, 2.5).outcome == HOLDS
    assert "seconds" in ch4.judge_c14(p, 1.0, 1.2, 1.3, 2.5).reason           # the teacher cost little
    assert "1.3x" in ch4.judge_c14(p, 1.0, 2.0, 3.0, 3.5).reason               # quantize+fuse far beyond ~30 %
    assert "integer" in ch4.judge_c14(p, 1.0, 2.0, 1.3, 1.6).reason            # student not 2x
    v = ch4.judge_c14(p, 1.0, 2.0, None, 2.5, "torch.compile did not work here")
    assert v.outcome == INCONCLUSIVE and "compile" in v.reason
    assert ch4.judge_c14(p, 1.0, 2.0, None, 1.5).outcome == FAILS              # a measured part already fails


def test_c14_prediction_uses_the_timed_memory_bound_pair():
    tiny, student = Transformer.from_preset("tiny").config, Transformer.from_preset("tiny", n_layers=2).config
    big = Transformer.from_preset("small", n_layers=4, vocab_size=4096).config  # C12's smoke model, ~110 MB
    half = Transformer.from_preset("small", n_layers=2, vocab_size=4096).config
    p = ch4.predict_c14(tiny, student, 64, big, half)
    # the bytes ratio is the timed pair's (blocks dominate: close to 2x), the FLOP ratio the trained pair's
    assert 1.7 < p.values["student bytes ratio"].value <= 2.0
    assert p.values["training FLOP ratio"].value == ch4.predict_c14(tiny, student, 64).values["training FLOP ratio"].value


# ------------------------------------------------------------------------------- measurements
def test_c6_measure_counts_the_chain(one_thread):
    m = fx.measure_c6(30, repeat=3)
    assert m["ops"] == 30 and m["measured_s"] > 0
