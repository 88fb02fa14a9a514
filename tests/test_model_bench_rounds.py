"""benches.model: the per-matrix read ceiling is timed in the same rounds as the decodes, and the
share is the median of per-round shares (speed-free: the timer is replaced)."""

from __future__ import annotations

import types

import pytest

from labkit.benches import model as model_bench


def test_the_ceiling_is_timed_once_per_round_between_the_decodes(monkeypatch):
    calls = []
    clock = iter([2.0, 1.0, 0.25] * 10)  # per round: t(N), t(1), then the reads

    def fake_measure(fn, **kw):
        fn()
        return types.SimpleNamespace(median=next(clock))
    monkeypatch.setattr(model_bench, "measure", fake_measure)
    out = model_bench.decode_rates({"a": lambda n: calls.append(("a", n))}, batch=1, new_tokens=5, repeat=3,
                                   ceiling=(100.0, lambda: calls.append(("read",))))
    # warm-up of the decode and of the reads, then per round: N tokens, 1 token, the reads
    assert calls == [("a", 5), ("read",)] + [("a", 5), ("a", 1), ("read",)] * 3
    assert out["ceiling"]["rounds"] == [400.0] * 3  # 100 bytes in 0.25 s
    assert out["a"]["step_s_rounds"] == [0.25] * 3  # (2 - 1) / (5 - 1)


def test_share_of_ceiling_is_the_median_of_per_round_shares():
    # round shares: 10/0.1/200 = 0.5, 10/0.1/100 = 1.0, 10/0.2/100 = 0.5
    assert model_bench.share_of_ceiling(10.0, [0.1, 0.1, 0.2], [200.0, 100.0, 100.0]) == pytest.approx(0.5)
    assert model_bench.share_of_ceiling(10.0, [float("nan")], [1.0]) != model_bench.share_of_ceiling(10.0, [float("nan")], [1.0])
