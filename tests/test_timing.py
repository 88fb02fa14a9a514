import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit import timing


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
       st.floats(0, 100))
def test_percentile_matches_numpy(xs, q):
    assert timing.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-9, abs=1e-9)


def test_percentile_single_sample_and_random_arrays():
    rng = np.random.default_rng(0)
    assert timing.percentile([3.5], 99) == 3.5
    for n in (1, 2, 7, 100, 1001):
        xs = rng.lognormal(size=n)
        for q in (0, 1, 50, 95, 99, 100):
            assert timing.percentile(xs, q) == pytest.approx(np.percentile(xs, q))


@pytest.mark.parametrize("bad", [-1, 100.5])
def test_percentile_rejects_bad_q(bad):
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        timing.percentile([1.0, 2.0], bad)


def test_percentile_empty_is_a_clear_error():
    with pytest.raises(ValueError, match="empty"):
        timing.percentile([], 50)


def test_stats_fields_are_consistent():
    s = timing.Stats.from_samples([0.3, 0.1, 0.2, 0.4])
    assert (s.n, s.min, s.max) == (4, 0.1, 0.4)
    assert s.median == s.p50 == pytest.approx(0.25)
    assert s.mean == pytest.approx(0.25)
    assert s.std == pytest.approx(np.std([0.3, 0.1, 0.2, 0.4]))
    assert s.min <= s.p50 <= s.p95 <= s.p99 <= s.max


def test_measure_sleep_median_within_20_percent():
    stats = timing.measure(lambda: time.sleep(0.01), warmup=1, repeat=15, device="cpu")
    assert stats.n == 15
    assert stats.median == pytest.approx(0.010, rel=0.20)


def test_measure_counts_warmup_and_min_time():
    calls = []
    stats = timing.measure(lambda: calls.append(1), warmup=4, repeat=3, min_time=0.0, device="cpu")
    assert len(calls) == 7 and stats.n == 3
    stats = timing.measure(lambda: time.sleep(0.002), warmup=0, repeat=1, min_time=0.02, device="cpu")
    assert stats.n >= 5  # kept going until ~20 ms of timed calls


@pytest.mark.parametrize("kwargs", [{"repeat": 0}, {"warmup": -1}, {"min_time": -1.0}])
def test_measure_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="repeat"):
        timing.measure(lambda: None, device="cpu", **kwargs)


def test_spans_breakdown_shares_sum_to_100():
    spans = timing.Spans(device="cpu")
    for _ in range(3):
        with spans("pre"):
            time.sleep(0.002)
        with spans("model"):
            time.sleep(0.006)
        spans.next_request()
    rows = {r["phase"]: r for r in spans.table()}
    assert list(rows) == ["pre", "model"]
    assert rows["pre"]["calls"] == 3
    assert sum(r["share_pct"] for r in rows.values()) == pytest.approx(100)
    assert rows["model"]["share_pct"] > rows["pre"]["share_pct"]
    assert "model" in spans.format_table()


def test_spans_records_time_even_when_the_phase_raises():
    spans = timing.Spans(device="cpu")
    with pytest.raises(RuntimeError):
        with spans("boom"):
            raise RuntimeError
    assert [name for _, name, _ in spans.records] == ["boom"]


def test_first_calls_times_each_call_without_warmup():
    calls = []
    xs = timing.first_calls(lambda: calls.append(time.sleep(0.001)), 5, device="cpu")
    assert len(xs) == 5 == len(calls) and all(x >= 0.001 for x in xs)
    with pytest.raises(ValueError, match="n must be"):
        timing.first_calls(lambda: None, 0, device="cpu")


def test_time_decode_steps_rewinds_the_cache_before_every_call():
    import torch

    from labkit.model import Transformer

    m = Transformer.from_preset("tiny", n_layers=1, dim=32, n_heads=4, n_kv_heads=2, hidden_dim=48,
                                vocab_size=64, max_seq_len=64)
    cache = m.new_cache(2, 20)
    tok = torch.tensor([1, 2])
    st = timing.time_decode_steps(m, cache, tok, 10, steps=3, warmup=1, repeat=4)
    assert st.n == 4 and st.median > 0
    assert cache.lengths.tolist() == [13, 13] and cache.filled == 13  # 10 rewound + 3 steps, every call
    cache.rewind(0)
    assert cache.lengths.tolist() == [0, 0] and cache.filled == 0
    with pytest.raises(ValueError, match="rewind"):
        cache.rewind(21)
    assert timing.decode_tok_s(m, batch=2, context=8, repeat=2) > 0
