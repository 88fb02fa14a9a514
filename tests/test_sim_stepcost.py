"""The per-step cost model (`labkit.sim.stepcost`): interpolation, the grid's limits, parity."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.sim import cost as cost_mod
from labkit.sim.stepcost import StepCost, StepProfile, interp, isotonic

BATCHES, CONTEXTS, PROMPTS = (1, 2, 4, 8, 16), (8.0, 64.0, 200.0, 480.0), (1, 16, 64, 256, 500)


def decode_truth(b: float, c: float) -> float:
    """A CPU-like decode pass (s): fast growth over the first sequences, then slow; linear in
    the context read. Not linear in the batch, so a line through it would miss."""
    return 2e-3 + 1.5e-3 * np.sqrt(b) + 2e-7 * b * c


def prefill_truth(p: float) -> float:
    return 2.5e-3 + 4e-5 * p + 1e-8 * p * p


def profile(max_context: int = 512) -> StepProfile:
    return StepProfile.from_points([(b, c, decode_truth(b, c)) for b in BATCHES for c in CONTEXTS],
                                   [(p, prefill_truth(p)) for p in PROMPTS], max_context, source="synthetic")


def test_interpolation_is_exact_at_every_grid_point():
    prof = profile()
    for b in BATCHES:
        for c in CONTEXTS:
            assert prof.decode_at(b, c) == pytest.approx(decode_truth(b, c), rel=1e-12)
    for p in PROMPTS:
        assert prof.prefill_at(p) == pytest.approx(prefill_truth(p), rel=1e-12)


def test_between_grid_points_the_value_is_linear_and_bracketed():
    prof = profile()
    mid = prof.decode_at(3, 64)  # halfway between batches 2 and 4
    assert mid == pytest.approx((decode_truth(2, 64) + decode_truth(4, 64)) / 2)
    assert decode_truth(2, 64) < mid < decode_truth(4, 64)
    assert prof.prefill_at(40) == pytest.approx(prefill_truth(16) + (prefill_truth(64) - prefill_truth(16)) / 2)


@settings(max_examples=60, deadline=None)
@given(st.floats(1, 16), st.floats(1, 16), st.floats(0, 512), st.floats(0, 512), st.floats(1, 2000), st.floats(1, 2000))
def test_more_work_never_costs_less(b1, b2, c1, c2, p1, p2):
    prof = profile()
    (b1, b2), (c1, c2), (p1, p2) = sorted((b1, b2)), sorted((c1, c2)), sorted((p1, p2))
    assert prof.decode_at(b1, c1) <= prof.decode_at(b2, c1) + 1e-15
    assert prof.decode_at(b1, c1) <= prof.decode_at(b1, c2) + 1e-15
    assert prof.prefill_at(p1) <= prof.prefill_at(p2) + 1e-15


def test_noisy_measurements_are_made_monotone():
    """A point measured faster than a smaller one (noise) is pooled with it (their mean): more
    work never costs less, and the noise is not carried up to every bigger point."""
    dec = [(b, c, decode_truth(b, c)) for b in (1, 2, 4) for c in (8, 64)]
    dec[2] = (2, 8, 0.5 * decode_truth(2, 8))  # batch 2 measured faster than batch 1
    pre = [(1, 3e-3), (16, 2e-3), (64, 5e-3)]
    prof = StepProfile.from_points(dec, pre, 128)
    pooled = (decode_truth(1, 8) + 0.5 * decode_truth(2, 8)) / 2
    assert prof.decode_at(1, 8) == pytest.approx(pooled) and prof.decode_at(2, 8) == pytest.approx(pooled)
    assert prof.decode_at(4, 8) == pytest.approx(decode_truth(4, 8))
    assert prof.prefill_at(1) == pytest.approx(2.5e-3) and prof.prefill_at(16) == pytest.approx(2.5e-3)
    assert np.all(np.diff(np.asarray(prof.decode_s), axis=0) >= 0) and np.all(np.diff(prof.decode_s, axis=1) >= 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=30))
def test_isotonic_is_the_closest_non_decreasing_sequence(y):
    fit = isotonic(y)
    y = np.asarray(y)
    assert np.all(np.diff(fit) >= -1e-9 * (1 + np.abs(fit[1:])))
    assert fit.sum() == pytest.approx(y.sum(), abs=1e-6)  # pooling keeps each block's total
    if np.all(np.diff(y) >= 0):
        np.testing.assert_allclose(fit, y)
    sse = ((fit - y) ** 2).sum()
    for other in (np.maximum.accumulate(y), np.minimum.accumulate(y[::-1])[::-1], np.full_like(y, y.mean())):
        assert sse <= ((other - y) ** 2).sum() + 1e-6


def test_noise_does_not_bias_the_grid_upwards():
    """10 % noise on a monotone truth, 200 seeded profiles: the isotonic grid's mean error is near
    0; a running maximum (what the profile did before) reads every point after a high one high."""
    rng = np.random.default_rng(0)
    truth = np.array([[decode_truth(b, c) for c in CONTEXTS] for b in BATCHES])
    iso, run_max = [], []
    for _ in range(200):
        noisy = truth * rng.lognormal(0, 0.1, truth.shape)
        prof = StepProfile.from_points([(b, c, noisy[i, j]) for i, b in enumerate(BATCHES)
                                        for j, c in enumerate(CONTEXTS)], [(1, 1e-3)], 512)
        iso.append(np.asarray(prof.decode_s) / truth - 1)
        run_max.append(np.maximum.accumulate(np.maximum.accumulate(noisy, 0), 1) / truth - 1)
    bias_iso, bias_max = np.mean(iso), np.mean(run_max)
    assert abs(bias_iso) < 0.02 < bias_max


def test_out_of_grid_inputs_raise_clear_errors():
    prof = profile(max_context=512)
    with pytest.raises(ValueError, match=r"decode batch=17.*\[1, 16\]"):
        prof.decode_at(17, 64)
    with pytest.raises(ValueError, match=r"context=600.*max_context=512"):
        prof.decode_at(4, 600)
    with pytest.raises(ValueError, match="batch >= 1"):
        prof.decode_at(0, 64)
    with pytest.raises(ValueError, match=">= 1 prompt token"):
        prof.prefill_at(0)
    with pytest.raises(ValueError, match="must be >= 0"):
        StepCost(prof).step_time(-1, 0, 0)
    with pytest.raises(ValueError, match="overhead_s"):
        StepCost(prof, overhead_s=-1e-3)
    with pytest.raises(ValueError, match="strictly ascending"):
        StepProfile((2, 1), (8.0,), ((1e-3,), (1e-3,)), (1,), (1e-3,), 64)
    with pytest.raises(ValueError, match="full grid"):
        StepProfile.from_points([(1, 8, 1e-3), (1, 64, 2e-3), (2, 8, 2e-3)], [(1, 1e-3)], 64)
    with pytest.raises(ValueError, match="finite number of seconds > 0"):
        StepProfile((1,), (8.0,), ((0.0,),), (1,), (1e-3,), 64)


def test_within_the_grids_limits_the_edges_are_defined():
    """Below the first context point: the first point (an upper bound); between the last
    context point and max_context: the last segment extended; past the last prompt point:
    linear in tokens (a step's prompts add up past one sequence)."""
    prof = profile(max_context=512)
    assert prof.decode_at(4, 2) == pytest.approx(decode_truth(4, 8))
    slope = (decode_truth(4, 480) - decode_truth(4, 200)) / 280
    assert prof.decode_at(4, 512) == pytest.approx(decode_truth(4, 480) + 32 * slope)
    pslope = (prefill_truth(500) - prefill_truth(256)) / 244
    assert prof.prefill_at(1000) == pytest.approx(prefill_truth(500) + 500 * pslope)
    assert interp([1.0], [2.0], 5.0, extrapolate=True) == 2.0


def test_step_time_adds_passes_and_the_engines_overhead():
    prof = profile()
    cost = StepCost(prof, overhead_s=1e-3, overhead_per_row_s=1e-4, request_s=0.01)
    # decode only: 4 sequences of 100 tokens each
    assert cost.step_time(4, 0, 400) == pytest.approx(prof.decode_at(4, 100) + 1e-3 + 4e-4)
    # prefill only: one 64-token prompt
    assert cost.step_time(0, 64, 64) == pytest.approx(prof.prefill_at(64) + 1e-3 + 1e-4)
    # mixed: two passes (labkit's engine), the decoders' context excludes the prompt
    assert cost.step_time(4, 64, 464) == pytest.approx(prof.prefill_at(64) + prof.decode_at(4, 100) + 1e-3 + 5e-4)
    assert cost.step_time(0, 0, 0) == pytest.approx(1e-3)


def test_step_cost_round_trips_through_json(tmp_path):
    cost = StepCost(profile(), overhead_s=1e-3, overhead_per_row_s=2e-5, request_s=4e-3)
    path = cost_mod.save(cost, tmp_path / "c.json")
    back = cost_mod.load(path)
    assert isinstance(back, StepCost) and back == cost
    assert json.loads(path.read_text())["model"]["kind"] == "step"
    with pytest.raises(ValueError, match="choose one of linear, roofline, step"):
        cost_mod.from_dict({"kind": "bogus"})


def test_plan_time_lays_prompts_out_as_the_engine_does():
    """Prompts pad to the longest; decoders join the prompt pass only when that at most doubles
    the tokens (labkit.serve.engine.Engine._run), else they run a second, decode-only pass."""
    prof = profile()
    cost = StepCost(prof, overhead_s=1e-3, overhead_per_row_s=1e-4)
    # two prompts, 10 and 50 tokens, no decoders: one pass of 2 x 50 padded tokens
    assert cost.plan_time(0, [10, 50], 60) == pytest.approx(prof.prefill_at(100) + 1e-3 + 2e-4)
    # one 48-token prompt and 6 decoders at 100 tokens: 7 x 48 > 2 x 54, two passes
    assert cost.plan_time(6, [48], 648) == pytest.approx(prof.prefill_at(48) + prof.decode_at(6, 100) + 1e-3 + 7e-4)
    # one 2-token prompt and 6 decoders: 7 x 2 <= 2 x 8, one padded pass of 14 tokens
    assert cost.plan_time(6, [2], 602) == pytest.approx(prof.prefill_at(14) + 1e-3 + 7e-4)
    assert cost.plan_time(4, [], 400) == cost.step_time(4, 0, 400)
    with pytest.raises(ValueError, match="chunks >= 1 token"):
        cost.plan_time(1, [0], 10)


def test_serving_factor_scales_the_model_passes_only():
    prof = profile()
    plain, slow = StepCost(prof, overhead_s=1e-3), StepCost(prof, overhead_s=1e-3, serving_factor=1.5)
    assert slow.step_time(4, 0, 400) - 1e-3 == pytest.approx(1.5 * (plain.step_time(4, 0, 400) - 1e-3))
    with pytest.raises(ValueError, match="serving_factor"):
        StepCost(prof, serving_factor=0.0)


def test_merging_profiles_takes_the_median_per_point():
    a, b, c = profile(), profile(), profile()
    slow = StepProfile.from_points([(bb, cc, 2 * decode_truth(bb, cc)) for bb in BATCHES for cc in CONTEXTS],
                                   [(p, 2 * prefill_truth(p)) for p in PROMPTS], 512)
    assert StepProfile.merge([a, b, slow]).decode_s == a.decode_s
    two = StepProfile.merge([a, slow])
    assert two.decode_at(4, 64) == pytest.approx(1.5 * decode_truth(4, 64))
    assert two.prefill_at(64) == pytest.approx(1.5 * prefill_truth(64))
    with pytest.raises(ValueError, match="share one grid"):
        StepProfile.merge([a, profile(max_context=600)])
    assert c == a


def test_decode_read_groups_rows_as_the_paged_batch_does():
    """Decoders at 449, 29, 29 and 199 tokens (ends 450, 30, 30, 200): the paged batch reads the
    long pair to 450 and the short pair to 30 (`labkit.ragged`); the extra group adds group_s,
    scaled like every model pass."""
    prof = dataclasses.replace(profile(), group_s=4e-4)
    cost = StepCost(prof, serving_factor=1.5)
    assert cost.decode_read([449, 29, 29, 199]) == (2 * 450 + 2 * 30 - 4, pytest.approx(1.5 * 4e-4))
    assert cost.decode_read([100, 99, 98]) == (3 * 100, 0.0)  # nothing worth splitting: one group to the longest
    back = StepProfile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert back == prof and StepProfile.merge([prof, prof, profile()]).group_s == 4e-4
    with pytest.raises(ValueError, match="group_s"):
        dataclasses.replace(prof, group_s=-1.0)
