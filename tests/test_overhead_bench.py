"""labkit.benches.overhead: the in-process engine runs a closed-loop trace to the end, and
every request gets exactly the tokens it asked for."""

from labkit.benches import overhead as ob


def test_alone_runs_every_request_of_the_trace_in_closed_loop():
    specs = ob.trace("smoke", seed=0)[:6]
    specs = [s.__class__(**{**s.__dict__, "max_tokens": 3 + i}) for i, s in enumerate(specs)]
    got = ob.run_alone(specs, batch=2)
    tokens = sum(s.max_tokens for s in specs)
    # a step yields at most one token per running sequence (2 run at once), and at least one
    # token or one prompt: so 2 at a time never take fewer steps than tokens / 2, nor more than serially
    assert -(-tokens // 2) <= got["steps"] <= tokens + len(specs)
    assert got["wall_s"] > 0
