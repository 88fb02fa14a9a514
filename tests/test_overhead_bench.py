"""labkit.benches.overhead: the in-process engine runs a closed-loop trace to the end, and
every request gets exactly the tokens it asked for."""

import random

import pytest

from labkit.benches import overhead as ob


def test_alone_runs_every_request_of_the_trace_in_closed_loop():
    specs = ob.chunk("smoke", cycle=0)[:6]
    specs = [s.__class__(**{**s.__dict__, "max_tokens": 3 + i}) for i, s in enumerate(specs)]
    got = ob.Alone(batch=2).run(specs)
    tokens = sum(s.max_tokens for s in specs)
    # a step yields at most one token per running sequence (2 run at once), and at least one
    # token or one prompt: so 2 at a time never take fewer steps than tokens / 2, nor more than serially
    assert -(-tokens // 2) <= got["steps"] <= tokens + len(specs)
    assert got["wall_s"] > 0


def test_paired_shares_cancel_a_slowdown_that_hits_a_whole_cycle():
    """The VM drifting between cycles moves every way of a cycle alike: each cycle's ratio stays."""
    rng = random.Random(3)
    true_share = {"alone": 0.0, "a": 0.05, "b": 0.30}
    cycles = []
    for _ in range(5):
        speed = rng.uniform(0.6, 1.6)  # this cycle's slowdown, on every way alike
        cycles.append({w: {"wall_s": 8e-3 * 400 * (1 + s) * speed, "steps": 400} for w, s in true_share.items()})
    got = ob.paired_shares(cycles)
    for w, s in true_share.items():
        assert all(abs(x - s) < 1e-12 for x in got[w]), (w, got[w])


def test_paired_shares_divide_by_steps_and_need_the_reference():
    cycles = [{"alone": {"wall_s": 2.0, "steps": 200}, "x": {"wall_s": 2.2, "steps": 100}}]
    assert ob.paired_shares(cycles)["x"] == [pytest.approx(1.2)]  # 22 ms a step against 10 ms
    with pytest.raises(ValueError, match="no 'alone' run"):
        ob.paired_shares([{"x": {"wall_s": 1.0, "steps": 10}}])


def test_cycle_order_rotates_so_each_way_leads_once_in_turn():
    orders = [ob.cycle_order(r) for r in range(len(ob.WAYS))]
    assert all(sorted(o) == sorted(ob.WAYS) for o in orders)
    assert [o[0] for o in orders] == list(ob.WAYS)
