"""Bisection for the highest rate within a p99 target: on servers simulated by a known latency
curve, the bracket must contain the true crossing and be as narrow as asked."""

import math

import numpy as np
import pytest

from labkit.loadgen.bisect import bisection, p99_confidence, rate_at_target, ratio_bracket, take_turns


def knee_server(crossing: float, target: float, seed: int = 0):
    """A measure() whose p99 rises with the rate and crosses `target` exactly at `crossing`."""
    rng = np.random.default_rng(seed)

    def measure(rate: float):
        p99 = target * (rate / crossing) ** 2  # monotone in the rate
        e2e = np.full(200, p99 * 0.5)
        e2e[-3:] = p99  # the top 1.5% sit at p99, so the 99th percentile is p99
        return rng.permutation(e2e), 0.9 * rate
    return measure


@pytest.mark.parametrize("seed", range(12))
def test_bracket_contains_the_crossing_and_is_as_narrow_as_asked(seed):
    rng = np.random.default_rng(seed)
    crossing = float(rng.uniform(0.05, 50))
    lo, hi = sorted(rng.uniform(0.1, 20, 2))
    found = rate_at_target(knee_server(crossing, 2.0, seed), 2.0, lo, hi + 0.1, rel_tol=0.05, max_probes=40)
    meet, miss = found["bracket"]
    assert meet <= crossing < miss
    assert miss / meet - 1 <= 0.05
    assert found["rate"] == meet and found["throughput"] == pytest.approx(0.9 * meet)
    assert all(p.meets == (p.rate <= crossing) for p in found["probes"])


def test_probe_budget_is_respected_and_reported():
    found = rate_at_target(knee_server(3.0, 1.0), 1.0, 0.1, 100.0, rel_tol=1e-6, max_probes=5)
    assert len(found["probes"]) == 5
    meet, miss = found["bracket"]
    assert meet <= 3.0 < miss


def test_no_completed_request_counts_as_a_miss():
    found = rate_at_target(lambda r: np.array([]), 1.0, 1.0, 2.0, max_probes=3)
    assert math.isnan(found["rate"]) and all(not p.meets for p in found["probes"])


def test_confidence_is_high_far_from_the_target_and_near_half_on_it():
    e = np.random.default_rng(0).exponential(1.0, 500)
    p99 = np.percentile(e, 99)
    assert p99_confidence(e, 10 * p99)[2] > 0.99
    assert p99_confidence(e, p99 / 10)[2] > 0.99
    assert 0.3 < p99_confidence(e, p99)[2] <= 1.0


def test_ratio_bracket_spans_the_two_brackets():
    a = {"rate": 6.0, "bracket": (6.0, 6.5)}
    b = {"rate": 2.0, "bracket": (2.0, 2.2)}
    r, low, high = ratio_bracket(a, b)
    assert (r, low, high) == pytest.approx((3.0, 6.0 / 2.2, 6.5 / 2.0))


@pytest.mark.parametrize("kw,match", [({"target_s": 0}, "target_s"), ({"lo": 2, "hi": 1}, "lo < hi"),
                                      ({"rel_tol": 0}, "rel_tol"), ({"max_probes": 1}, "max_probes")])
def test_bad_arguments_name_the_value(kw, match):
    args = {"target_s": 1.0, "lo": 1.0, "hi": 2.0, **kw}
    with pytest.raises(ValueError, match=match):
        rate_at_target(lambda r: np.ones(3), **args)


def test_requests_that_never_completed_make_an_infinite_p99_not_nan():
    e = np.r_[np.ones(95), np.full(5, np.inf)]
    p, meets, conf = p99_confidence(e, 10.0)
    assert p == np.inf and not meets and conf > 0.9
    assert p99_confidence(np.r_[np.ones(995), np.full(5, np.inf)], 10.0)[1]  # 0.5% lost: p99 still finite


def test_searches_taking_turns_alternate_probes_and_find_what_each_finds_alone():
    """Two searches on one machine: their probes alternate (A, B, A, B, ... until one is done) and
    each ends with the very bracket and probes it finds run alone."""
    calls = []

    def logged(name, measure):
        def m(rate):
            calls.append(name)
            return measure(rate)
        return m

    args = {"static": (1.5, 0.5, 6.0), "continuous": (5.0, 0.5, 20.0)}  # crossing, lo, hi
    alone = {k: rate_at_target(knee_server(c, 1.0), 1.0, lo, hi, rel_tol=0.05, max_probes=9)
             for k, (c, lo, hi) in args.items()}
    turns = take_turns({k: (bisection(1.0, lo, hi, rel_tol=0.05, max_probes=9), logged(k, knee_server(c, 1.0)))
                        for k, (c, lo, hi) in args.items()})
    for k in args:
        assert turns[k]["bracket"] == alone[k]["bracket"] and turns[k]["probes"] == alone[k]["probes"]
    n = min(len(alone[k]["probes"]) for k in args)
    assert calls[: 2 * n] == ["static", "continuous"] * n
    assert len(calls) == sum(len(alone[k]["probes"]) for k in args)


def test_a_bad_search_is_refused_before_any_probe():
    with pytest.raises(ValueError, match="lo < hi"):
        bisection(1.0, 2.0, 1.0)
