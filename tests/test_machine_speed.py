"""The machine's speed read from a step trace (`labkit.loadgen.speed`), and the twin replaying it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from labkit.loadgen import fidelity
from labkit.loadgen.speed import BANDS, MeasuredSpeed, measure_speed, model_errors, priced
from labkit.serve.steptrace import Step
from labkit.sim.stepcost import StepCost, StepProfile
from labkit.sim.workload import Workload

BATCHES, CONTEXTS, PROMPTS = (1, 2, 4, 8, 16), (8.0, 128.0, 500.0), (1, 32, 128, 512, 1000)


def _cost() -> StepCost:
    """A per-step model with a known, CPU-like grid (ms-scale decode, linear prefill)."""
    decode = [(b, c, 2e-3 + 3e-4 * b ** 0.7 + 1e-6 * b * c) for b in BATCHES for c in CONTEXTS]
    return StepCost(StepProfile.from_points(decode, [(p, 2e-3 + 8e-5 * p) for p in PROMPTS], 512))


def _steps(n: int, duration_s: float, speed, seed: int = 0) -> list[Step]:
    """`n` steps of random composition over `duration_s` s, each running at `speed(t)` x its price."""
    rng = np.random.default_rng(seed)
    cost, out = _cost(), []
    for t in np.sort(rng.uniform(0, duration_s, n)):
        chunks = tuple(int(x) for x in rng.integers(4, 300, rng.integers(1, 3))) if rng.random() < 0.15 else ()
        contexts = tuple(int(x) for x in rng.integers(4, 480, rng.integers(0 if chunks else 1, 12)))
        step = Step(float(t), 0.0, 0.0, chunks, contexts)
        model = float(priced([step], cost)[0]) * speed(t)
        out.append(step._replace(step_s=model + 1e-4, model_s=model))
    return out


def test_the_speed_of_each_window_is_read_back_from_the_steps():
    """Steps run at x0.8 for 2 s, then x1.25: each 1 s window reads its own factor back, the run
    its time-weighted whole; a window with too few steps takes the run's."""
    truth = lambda t: 0.8 if t < 2 else 1.25  # noqa: E731
    steps = _steps(400, 4.0, truth)
    sp = measure_speed(steps, _cost(), t0=0.0, window_s=1.0)
    assert sp.factors == pytest.approx((0.8, 0.8, 1.25, 1.25))
    assert sp.overall == pytest.approx(sum(s.model_s for s in steps) / priced(steps, _cost()).sum())
    assert 0.8 < sp.overall < 1.25
    # the twin's clock starts at t0: t = 2.5 s is the window at 2.5 + t0
    shifted = measure_speed(steps, _cost(), t0=1.0, window_s=1.0)
    assert shifted(0.5) == pytest.approx(0.8) and shifted(1.5) == pytest.approx(1.25)
    assert shifted(-3.0) == shifted.factors[0] and shifted(99.0) == shifted.factors[-1]
    sparse = measure_speed(steps, _cost(), t0=0.0, window_s=1.0, min_steps=10_000)
    assert sparse.factors == (sparse.overall,) * 4


def test_measuring_the_speed_refuses_bad_input():
    with pytest.raises(ValueError, match="window_s"):
        measure_speed(_steps(10, 1.0, lambda t: 1.0), _cost(), 0.0, window_s=0.0)
    with pytest.raises(ValueError, match="no steps"):
        measure_speed([], _cost(), 0.0)


def test_model_errors_split_the_profiles_error_by_kind_of_step():
    """Steps that ran at x1.25 their price: the profile under-prices every kind by 20 %, and every
    step is in exactly one kind."""
    steps = _steps(500, 2.0, lambda t: 1.25, seed=1)
    errs = model_errors(steps, _cost())
    assert len(errs) == 1 + len(BANDS) and sum(e["steps"] for e in errs.values()) == len(steps)
    assert all(e["error"] == pytest.approx(1 / 1.25 - 1) for e in errs.values() if e["steps"])
    assert errs["prompt steps"]["steps"] == sum(1 for s in steps if s.chunks)


def test_a_speed_factor_scales_every_simulated_step():
    """All requests arrive at once, so the schedule cannot change: at speed x2 every step takes twice as long."""
    wl = Workload(np.zeros(6), np.array([10, 50, 90, 20, 30, 40]), np.array([5, 9, 3, 7, 4, 6]),
                  np.zeros(6, dtype=np.int64))
    server = fidelity.SimServer("continuous", max_batch=8, max_queue=40, kv_tokens=8 * 512, max_len=512)
    one, two = server.run(wl, _cost()), server.run(wl, _cost(), speed=lambda t: 2.0)
    assert np.allclose(two.timeline["dt"], 2 * one.timeline["dt"])
    assert np.allclose(two.t_done, 2 * one.t_done)


def test_the_twin_replaying_the_measured_speed_matches_an_engine_that_slowed_down():
    """An engine (the per-step model itself) that ran x0.8 for 4 s, then x1.3: replayed at the
    measured speed, the twin matches every latency; at the profile's speed it misses."""
    from labkit.loadgen import summary
    from labkit.sim import synthetic
    from test_fidelity_per_step import _records

    truth = MeasuredSpeed(t0=0.0, window_s=4.0, factors=(0.8, 1.3), overall=1.05)
    wl = synthetic(300, 60.0, prompt={"kind": "uniform", "low": 4, "high": 200},
                   output={"kind": "uniform", "low": 2, "high": 60}, seed=3)
    server = fidelity.SimServer("continuous", max_batch=8, max_queue=300, kv_tokens=8 * 512, max_len=512)
    rs = _records(wl, server.run(wl, _cost(), speed=truth), 0.0)
    real = summary.summarize(rs)
    replayed = fidelity.compare(rs, real, server, _cost(), truth)["error"]
    assert all(abs(e) < 1e-9 for k, e in replayed.items() if k != "throughput_rps"), replayed
    profiled = fidelity.compare(rs, real, server, _cost())["error"]
    assert max(abs(e) for e in profiled.values()) > 0.1, profiled


def test_the_wake_up_cost_is_interpolated_from_its_points_and_checked():
    prof = dataclasses.replace(_cost().profile, cold=((0.01, 1e-3), (0.1, 4e-3)))
    assert prof.cold_at(0.0) == 0.0 and prof.cold_at(0.005) == pytest.approx(0.5e-3)
    assert prof.cold_at(0.055) == pytest.approx(2.5e-3) and prof.cold_at(5.0) == pytest.approx(4e-3)
    assert StepProfile.from_dict(prof.to_dict()) == prof
    other = dataclasses.replace(prof, cold=((0.01, 3e-3), (0.1, 2e-3)))
    assert StepProfile.merge([prof, other, prof]).cold == prof.cold  # per-point median
    bare = dataclasses.replace(prof, cold=())
    assert StepProfile.merge([bare, prof]).cold == prof.cold  # a profile without the points adds none
    with pytest.raises(ValueError, match="same idle times"):  # never one profile's points silently kept
        StepProfile.merge([prof, dataclasses.replace(prof, cold=((0.02, 1e-3), (0.1, 4e-3)))])
    for bad in (((0.1, 1e-3), (0.01, 2e-3)), ((0.0, 1e-3),), ((0.01, -1e-3),)):
        with pytest.raises(ValueError, match="cold"):
            dataclasses.replace(prof, cold=bad)
    # measured points that make a longer idle cheaper are evened out, as the grid's are
    fit = StepProfile.from_points([(b, c, 1e-3 * b + 1e-6 * c) for b in (1, 2) for c in (8.0, 64.0)],
                                  [(1, 1e-3), (64, 2e-3)], 128, cold=[(0.01, 3e-3), (0.1, 1e-3)])
    assert fit.cold == ((0.01, 2e-3), (0.1, 2e-3))


def test_the_first_step_after_the_server_idled_pays_the_wake_up_cost():
    """Two requests a second apart: the step that starts the second one, after ~1 s of idling,
    costs the profile's wake-up cost more; no other step does."""
    cost = _cost()
    woke = dataclasses.replace(cost, profile=dataclasses.replace(cost.profile, cold=((0.5, 7e-3),)))
    wl = Workload(np.array([0.0, 1.0]), np.array([20, 20]), np.array([4, 4]), np.zeros(2, dtype=np.int64))
    server = fidelity.SimServer("continuous", max_batch=8, max_queue=40, kv_tokens=8 * 512, max_len=512)
    plain, cold = server.run(wl, cost).timeline["dt"], server.run(wl, woke).timeline["dt"]
    assert len(plain) == len(cold) == 8
    assert cold[4] == pytest.approx(plain[4] + 7e-3)  # idle 1 s > the last point: flat
    assert np.allclose(np.delete(cold, 4), np.delete(plain, 4))


def test_a_step_after_an_idle_gap_is_priced_with_the_wake_up_cost():
    """The trace's own gaps say which steps woke the engine: the step after a 0.3 s gap is priced
    with the wake-up cost, so an engine that paid exactly that reads as running at x1."""
    cost = _cost()
    woke = dataclasses.replace(cost, profile=dataclasses.replace(cost.profile, cold=((0.1, 5e-3),)))
    # 5 ms steps every 10 ms, and 0.35 s more before step 25
    steps = [s._replace(t=i * 0.01 + (0.35 if i >= 25 else 0.0), step_s=0.005)
             for i, s in enumerate(_steps(50, 1.0, lambda t: 1.0, seed=2))]
    plain, with_cold = priced(steps, cost), priced(steps, woke)
    gap = steps[25].t - steps[24].t - steps[24].step_s
    assert with_cold[25] - plain[25] == pytest.approx(woke.profile.cold_at(gap)) and gap > 0.1
    # every other step has a 5 ms gap: half of the 0.1 s point's slope
    assert np.allclose(np.delete(with_cold - plain, 25)[1:], woke.profile.cold_at(0.005))
    paid = [s._replace(model_s=float(p)) for s, p in zip(steps, with_cold)]
    assert measure_speed(paid, woke, 0.0, min_steps=1).overall == pytest.approx(1.0)
