"""Judges of C1-C5 on synthetic measurements (each made to hold, to fail and, where it can,
to be inconclusive), the knee fit on synthetic curves, and the cheap pieces that run here
(the counter probe, the intensity sweep on a tiny array). No assertion depends on speed."""

import math

import pytest

from labkit import roofline
from labkit.bench.counters import CounterReading, CountersUnavailable
from labkit.ledger import FAILS, HOLDS, INCONCLUSIVE, Verdict, ch1, ch2

ROOF = roofline.Roofline("toy", {"fp32": 200e9}, 20e9)  # ridge 10 FLOP/B


# ------------------------------------------------------------------------------- C1
def _c1_prediction():
    pre = {"intensity": 60.0, "time_s": 256 * 2e9 / 200e9}
    dec = {"intensity": 0.5, "time_s": 1e9 / 20e9}
    return ch1.predict_c1(ROOF, pre, dec, 256)


PREFILL = [{"prompt_len": 16, "tokens_per_s": 900.0, "flop_per_s": 40e9},
           {"prompt_len": 256, "tokens_per_s": 5000.0, "flop_per_s": 150e9}]
DECODE = [{"batch": 1, "context": 64, "tokens_per_s": 50.0, "bytes_per_s": 15e9, "s_per_step": 0.020},
          {"batch": 8, "context": 64, "tokens_per_s": 320.0, "bytes_per_s": 16e9, "s_per_step": 0.025},
          {"batch": 1, "context": 512, "tokens_per_s": 10.0, "bytes_per_s": 1e9, "s_per_step": 0.1}]


def test_c1_prediction_from_shape_and_ceilings():
    p = _c1_prediction()
    assert p.claim == "C1" and "compute-bound" in p.statement and "memory-bound" in p.statement
    assert p.values["ridge"].value == pytest.approx(10.0)


def test_c1_holds():
    v = ch1.judge_c1(_c1_prediction(), PREFILL, DECODE)
    assert v.outcome == HOLDS, v
    assert v.evidence["prefill / decode tokens/s"].value == pytest.approx(100.0)  # longest prompt, batch 1, short ctx
    assert v.evidence["decode share of bandwidth"].value == pytest.approx(75.0)


def test_c1_fails_when_decode_does_not_read_at_bandwidth():
    slow = [dict(DECODE[0], bytes_per_s=4e9), DECODE[1]]
    v = ch1.judge_c1(_c1_prediction(), PREFILL, slow)
    assert v.outcome == FAILS and "bandwidth" in v.reason


def test_c1_fails_when_a_batch_costs_like_separate_steps():
    v = ch1.judge_c1(_c1_prediction(), PREFILL, [DECODE[0], dict(DECODE[1], s_per_step=0.16)])
    assert v.outcome == FAILS and "not shared" in v.reason


def test_c1_fails_when_prefill_is_serial_or_slow():
    serial = [dict(PREFILL[1], tokens_per_s=100.0, flop_per_s=20e9)]
    v = ch1.judge_c1(_c1_prediction(), serial, DECODE)
    assert v.outcome == FAILS and "faster than decode" in v.reason and "of the measured peak" in v.reason


def test_c1_rejects_empty_rows():
    with pytest.raises(ValueError, match="prefill and decode rows"):
        ch1.judge_c1(_c1_prediction(), [], DECODE)


# ------------------------------------------------------------------------------- C2
def _shares(typical_pre, typical_post, heavy_pre):
    return {ch1.TYPICAL: {"pre": typical_pre, "model": 100 - typical_pre - typical_post, "post": typical_post},
            ch1.HEAVY: {"pre": heavy_pre, "model": 100 - heavy_pre - 2, "post": 2.0},
            "cheap (greedy, no RAG)": {"pre": 1.0, "model": 98.0, "post": 1.0}}


def test_c2_holds_inside_the_range():
    v = ch1.judge_c2(ch1.predict_c2(), _shares(10.0, 5.0, 50.0))
    assert v.outcome == HOLDS
    assert v.evidence["distance from 10-20 %"].value == 0.0


def test_c2_fails_outside_the_range_and_says_how_far():
    below = ch1.judge_c2(ch1.predict_c2(), _shares(3.0, 2.0, 50.0))
    assert below.outcome == FAILS and "5.0 points below" in below.reason
    assert below.evidence["distance from 10-20 %"].value == pytest.approx(-5.0)
    above = ch1.judge_c2(ch1.predict_c2(), _shares(20.0, 10.0, 50.0))
    assert above.outcome == FAILS and above.evidence["distance from 10-20 %"].value == pytest.approx(10.0)


def test_c2_fails_when_heavy_retrieval_adds_nothing():
    v = ch1.judge_c2(ch1.predict_c2(), _shares(10.0, 5.0, 10.0))
    assert v.outcome == FAILS and "heavy retrieval" in v.reason


def test_c2_inconclusive_without_timed_spans_and_bad_names():
    v = ch1.judge_c2(ch1.predict_c2(), _shares(150.0, 5.0, 50.0))
    assert v.outcome == INCONCLUSIVE
    with pytest.raises(ValueError, match="no path 'typical"):
        ch1.judge_c2(ch1.predict_c2(), {"x": {"pre": 1, "model": 98, "post": 1}})


# ------------------------------------------------------------------------------- C3
GEMM, GEMV = {"m": 768, "n": 768, "k": 768}, {"m": 1, "n": 8192, "k": 4096}


def _c3(gemm, decode):
    return {"gemm_speedup": gemm, "decode_speedup": decode}


def test_c3_holds_fails_and_is_inconclusive():
    p = ch2.predict_c3("1 -> 2 threads", GEMM, GEMV, 10.0)
    assert p.values["GEMV intensity"].value < 10.0 < p.values["GEMM intensity"].value
    assert ch2.judge_c3(p, _c3(1.9, 1.05)).outcome == HOLDS
    v = ch2.judge_c3(p, _c3(1.9, 1.8))
    assert v.outcome == FAILS and "bandwidth" in v.reason
    v = ch2.judge_c3(p, _c3(1.1, 1.0))
    assert v.outcome == INCONCLUSIVE and "did not change enough" in v.reason
    v = ch2.judge_c3(p, None, "more compute on mps")
    assert v.outcome == INCONCLUSIVE and "no way to add compute" in v.reason


def test_c3_knob_per_device():
    import torch

    assert ch2.compute_knob(torch.device("meta")) is None
    knob = ch2.compute_knob(torch.device("cuda"))
    assert knob is not None and knob[2] == {"dtype": "tf32"}


# ------------------------------------------------------------------------------- C4
def _roof_curve(bw, peak, intensities):
    """min(peak, I x bw): a clean roofline."""
    return [min(peak, i * bw) for i in intensities]


INTENS = [2.0 ** k for k in range(-1, 8)]  # 0.5 .. 128 FLOP/B


def test_fit_roofline_finds_the_knee_of_a_clean_roofline():
    fit = ch2.fit_roofline(INTENS, _roof_curve(20e9, 200e9, INTENS))
    assert fit["knee"] == pytest.approx(10.0, rel=0.2) and fit["rms"] < 0.05
    with pytest.raises(ValueError, match=">= 3"):
        ch2.fit_roofline([1.0, 2.0], [1.0, 2.0])


def test_c4_holds_when_the_knee_is_near_the_ridge():
    p = ch2.predict_c4(ROOF)
    # the kernel reaches 80 % of STREAM and 85 % of the GEMM peak: knee ~ 10.6 FLOP/B
    v = ch2.judge_c4(p, INTENS, _roof_curve(16e9, 170e9, INTENS))
    assert v.outcome == HOLDS, v
    assert 0.8 < v.evidence["knee / ridge"].value < 1.3


def test_c4_fails_when_the_knee_is_far_from_the_ridge():
    p = ch2.predict_c4(ROOF)
    v = ch2.judge_c4(p, INTENS, _roof_curve(20e9, 20e9, INTENS))  # plateau 10x below the peak: knee at 1
    assert v.outcome == FAILS and "below the predicted ridge" in v.reason


def test_c4_fails_when_the_curve_sits_far_below_the_ceilings():
    p = ch2.predict_c4(ROOF)
    v = ch2.judge_c4(p, INTENS, _roof_curve(4e9, 40e9, INTENS))  # right knee, 5x below both ceilings
    assert v.outcome == FAILS and "fitted slope" in v.reason and "fitted plateau" in v.reason
    assert "knee" not in v.reason


def test_c4_fails_when_the_curve_has_no_knee():
    p = ch2.predict_c4(ROOF)
    wide = [2.0 ** k for k in range(-4, 11)]
    # FLOP/s ~ sqrt(intensity) everywhere: the best two-segment fit puts its knee near the
    # ridge (6.7 FLOP/B), but the points do not follow it
    v = ch2.judge_c4(p, wide, [200e9 * (i / 10) ** 0.5 for i in wide])
    assert v.outcome == FAILS and "scatter" in v.reason and "knee" not in v.reason


def test_c4_inconclusive_when_the_sweep_misses_the_ridge():
    p = ch2.predict_c4(ROOF)
    low = [0.25, 0.5, 1.0, 2.0, 4.0]
    assert ch2.judge_c4(p, low, _roof_curve(20e9, 200e9, low)).outcome == INCONCLUSIVE
    assert ch2.judge_c4(p, INTENS[:3], _roof_curve(20e9, 200e9, INTENS[:3])).outcome == INCONCLUSIVE


def test_sweep_widths_span_the_ridge():
    w = ch2.sweep_widths(10.0, 4)
    assert w == sorted(w) and w[0] / 4 <= 10 / 2 and w[-1] / 4 >= 2 * 10
    with pytest.raises(ValueError, match="ridge"):
        ch2.sweep_widths(float("nan"), 4)


def test_intensity_sweep_rows_have_the_analytic_intensity(one_thread):
    from labkit.bench.experiments import intensity_sweep

    rows = intensity_sweep("cpu", [4, 16], nbytes=2**20, repeat=1)
    assert [r.shape["width"] for r in rows] == [4, 16]
    for r in rows:  # 2 n w FLOP over (2 n + w^2) x 4 bytes ~ w / 4 FLOP/B
        assert r.intensity == pytest.approx(r.shape["width"] / 4, rel=0.01)
        assert r.best_flop_per_s > 0
    with pytest.raises(ValueError, match="int8"):
        intensity_sweep("cpu", [4], nbytes=2**20, dtype="int8")


# ------------------------------------------------------------------------------- C5
def _r(compute, bandwidth):
    return CounterReading(compute, bandwidth, 1.0, "synthetic: test")


def test_c5_holds_and_fails_on_counter_readings():
    p = ch2.predict_c5(ROOF, GEMM, GEMV)
    assert p.values["GEMV compute at best"].value < 30 < p.values["GEMM compute at best"].value
    assert ch2.judge_c5(p, {"GEMV": _r(0.05, 0.8), "GEMM": _r(0.7, 0.1)}).outcome == HOLDS
    v = ch2.judge_c5(p, {"GEMV": _r(0.5, 0.8), "GEMM": _r(0.7, 0.1)})   # GEMV busy computing
    assert v.outcome == FAILS and "not the signature" in v.reason
    v = ch2.judge_c5(p, {"GEMV": _r(0.05, 0.2), "GEMM": _r(0.7, 0.1)})  # GEMV not using bandwidth
    assert v.outcome == FAILS
    v = ch2.judge_c5(p, {"GEMV": _r(0.05, 0.8), "GEMM": _r(0.1, 0.9)})  # signature does not separate
    assert v.outcome == FAILS and "tell them apart" in v.reason
    with pytest.raises(ValueError, match="GEMM"):
        ch2.judge_c5(p, {"GEMV": _r(0.05, 0.8)})


def test_c5_inconclusive_without_counters():
    p = ch2.predict_c5(ROOF, GEMM, GEMV)
    v = ch2.judge_c5(p, "perf_event_open(cycles) failed: No such file or directory")
    assert v.outcome == INCONCLUSIVE and v.reason.startswith("no hardware counters on this machine")


def test_counter_probe_answers_either_way():
    from labkit.bench import counters

    try:
        counters.probe("cpu")
    except CountersUnavailable as exc:
        assert str(exc)  # says why
    with pytest.raises(ValueError, match="seconds"):
        counters.read(lambda: None, 0, "cpu", 1e9, 1e9)


def test_c5_run_gives_a_verdict():
    """Fast where counters are missing (the probe fails before anything is timed)."""
    from labkit.bench import counters

    try:
        counters.probe("cpu")
    except CountersUnavailable:
        v = ch2.run_c5("smoke", "cpu")
        assert isinstance(v, Verdict) and v.outcome == INCONCLUSIVE
        return
    pytest.skip("this machine has counters: the full C5 run is not a unit test")


def test_verdicts_round_trip():
    v = ch1.judge_c2(ch1.predict_c2(), _shares(10.0, 5.0, 50.0))
    assert Verdict.from_dict(v.as_dict()) == v
    assert not math.isnan(v.evidence["distance from 10-20 %"].value)


def test_perf_event_attr_layout_and_a_software_counter():
    """The ctypes perf_event_open wrapper: the attr puts type, size, config and the
    exclude_kernel bit where the kernel reads them; a software counter (allowed even in VMs
    without a PMU) opens and counts, which proves the layout against the running kernel."""
    import os
    import struct

    from labkit.bench import counters

    raw = counters._attr(4, 0xFF03, user_only=True)
    assert len(raw) == 112
    assert struct.unpack_from("IIQ", raw) == (4, 112, 0xFF03)
    assert struct.unpack_from("Q", raw, 40)[0] == 1 << 5
    assert not struct.unpack_from("Q", raw, 40)[0] & 1  # bit 0 (disabled) clear: counts from open
    try:
        fd = counters._open(1, 1, 0, -1)  # PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, this thread
    except (OSError, counters.CountersUnavailable) as exc:
        pytest.skip(f"perf_event_open not allowed here: {exc}")
    try:
        sum(range(200_000))
        assert counters._value(fd) > 0
    finally:
        os.close(fd)


def test_c2_measure_serves_every_path_interleaved(one_thread):
    from labkit import pipeline
    from labkit.model import load_tiny

    paths = ch1.measure_c2(load_tiny("cpu"), ["Who is Falstaff?"], max_new_tokens=2, n_docs=50, warmup=0)
    assert set(paths) == set(pipeline.standard_configs())
    shares = {name: pipeline.breakdown(p.spans) for name, p in paths.items()}
    assert all(s["pre"] + s["model"] + s["post"] == pytest.approx(100.0) for s in shares.values())
    assert ch1.judge_c2(ch1.predict_c2(), shares).outcome in (HOLDS, FAILS)
