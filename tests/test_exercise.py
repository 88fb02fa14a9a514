"""Every exercise: its reference answer passes its own check, a plausible wrong one fails."""

import pytest

from labkit import exercise

# A guarded semantic-cache sweep: precision dips under 99% below 0.9 (0.85 still looks fine alone).
SWEEP = [dict(threshold=t, hits=h, true_hits=h - f, false_hits=f, hit_rate=(h - f) / 125,
              precision=(h - f) / h if h else float("nan"))
         for t, h, f in ((0.8, 94, 2), (0.85, 83, 1), (0.9, 63, 1), (0.905, 58, 0), (0.95, 24, 0), (1.0, 1, 0))]

# A CSR-vs-dense sweep (time ratio, > 1: CSR slower) that wins from 90% sparsity on.
BREAKEVEN = [{"sparsity": x, "csr_over_dense": r}
             for x, r in ((0.5, 3.1), (0.7, 1.9), (0.8, 1.3), (0.9, 0.8), (0.95, 0.45), (0.99, 0.1))]

# name -> (this run's measurements, a plausible wrong answer)
CASES = {
    "cold_over_warm": ({"cold_first_s": 0.05, "warm_median_s": 0.001}, 1.0),
    "mean_or_median": ({"mean_s": 0.02, "median_s": 0.0011, "typical_s": 0.001}, "median"),
    "decode_tok_s_batch1": ({"weight_bytes": 4e8, "bandwidth": 4e10, "measured_tok_s": 80.0}, 1000.0),
    "decode_tok_s_batched": ({"batch": 8, "tok_s_b1": 80.0, "measured_tok_s": 560.0, "roofline_tok_s": 620.0}, 80.0),
    # pre+post share (%) of each knob's path, as notebook 01 reads it from pipeline.breakdown
    "costlier_knob": ({"options": ["slow tokenizer", "heavy RAG"],
                       "scores": {"slow tokenizer": 9.0, "heavy RAG": 41.0}}, "slow tokenizer"),
    "ridge_point": ({"peak_flop_s": 1e12, "bandwidth": 5e10}, 2.0),
    "kernel_bound": ({"kernel": "a decode linear at batch 16", "intensity": 7.9, "peak_flop_s": 1e12,
                      "bandwidth": 5e10}, "compute"),
    # fp32 on a 20 FLOP/B ridge: 2 B d^2 / (4 d^2) = ridge -> B = 40
    "batch_to_ridge": ({"d": 4096, "dtype": "fp32", "itemsize": 4, "ridge": 20.0, "batch_at_ridge": 41}, 1),
    "tiny_ops_time": ({"per_op_s": 4e-6, "ops": 1000, "measured_s": 4.4e-3}, 4e-5),
    # eager / fused time of notebook 03's two chains
    "fusion_gain": ({"options": ["bias_gelu_residual", "add_rmsnorm"],
                     "scores": {"bias_gelu_residual": 1.21, "add_rmsnorm": 1.55}}, "bias_gelu_residual"),
    "int8_bytes_ratio": ({"int8_bytes": 2.6e6, "fp32_bytes": 1e7}, 0.5),
    # notebook 04's smoke scan of the tiny checkpoint: the output head dominates
    "keep_in_high_precision": ({"layers": ["layers.0.attention.wqkv", "layers.0.feed_forward.w2", "output"],
                                "sensitivity": {"layers.0.attention.wqkv": 0.12, "layers.0.feed_forward.w2": 0.14,
                                                "output": 0.40}}, "layers.0.attention.wqkv"),
    "kv_int8_fit": ({"head_dim": 32, "fp32_bytes_per_token": 4096, "int8_bytes_per_token": 1152}, 4.0),
    "sparse_faster": ({"sparsity": 0.5, "options": ["dense", "CSR"], "times_s": {"dense": 1e-3, "CSR": 3e-3}}, "csr"),
    "csr_breakeven": ({"sweep": [0.5, 0.7, 0.8, 0.9, 0.95, 0.99], "rows": BREAKEVEN}, 0.5),
    "distill_cost": ({"student_layers": 2, "teacher_layers": 4, "flop_ratio": 1.67, "seconds_ratio": 1.8}, 1.0),
    "md1_wait": ({"rho": 0.9, "service_s": 1.0, "simulated_wq_s": 4.3}, 9.0),   # M/M/1's answer
    "short_wait_scheduler": ({"schedulers": ["static", "dynamic", "continuous"],
                              "short_e2e_s": {"static": 800.0, "dynamic": 11.0, "continuous": 1.2}}, "dynamic"),
    # p99 TTFT (s) falls as the batch limit grows past what the offered load needs
    "max_batch_for_slo": ({"candidates": [4, 8, 16, 32, 64, 128, 256], "limit": 1.0, "rate": 3.9, "lo": 4, "hi": 256,
                           "evaluate": lambda b: 0.2 if b >= 32 else 10.0 * 32 / b}, 16),
    "kv_bytes_per_token": ({"layers": 4, "kv_heads": 2, "head_dim": 32, "dtype_bytes": 4,
                            "measured_bytes_per_token": 2048}, 1024),
    "int8_concurrency": ({"base_seqs": 23, "base_bytes_per_token": 4096, "int8_bytes_per_token": 1152,
                          "int8_seqs": 70}, 23),
    "safe_threshold": ({"target": 0.99, "rows": SWEEP}, 0.8),
    "knee_level": ({"axis": "concurrency", "levels": [1, 2, 4, 8, 16, 32], "factor": 2.0,
                    "p99_by_level": {1: 0.25, 2: 0.2, 4: 0.27, 8: 0.34, 16: 0.64, 32: 1.36}}, 32),
    "tail_or_mean": ({"mean_a": 1.0, "mean_b": 0.7, "p99_a": 5.0, "p99_b": 4.75}, "p99"),
    "tail_cause": ({"spans": ["queue", "preprocess", "model"],
                    "p99_span_s": {"queue": 0.8, "preprocess": 0.3, "model": 0.1}}, "model"),
    "locked_capacity": ({"hold_ms": 125.0, "rate": 6.8}, 16.0),   # 2 cores / hold time: a lock is one server
    "queue_bound": ({"capacity": 20.0, "slo_ms": 900.0, "normal_ms": 300.0}, 20),   # capacity x SLO, no slack
}


def test_every_exercise_has_a_case():
    assert set(CASES) == set(exercise.EXERCISES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_passes_and_wrong_answer_fails(name, capsys):
    ctx, wrong = CASES[name]
    exercise.ask(name, **ctx)
    assert "Your turn" in capsys.readouterr().out
    assert exercise.check(name, exercise.solution(name)) is True
    assert exercise.check(name, wrong) is False
    out = capsys.readouterr().out
    assert "right" in out and "not quite" in out


def test_unanswered_is_not_an_error_and_bad_input_is_named(capsys):
    exercise.ask("ridge_point", peak_flop_s=1e12, bandwidth=5e10)
    assert exercise.check("ridge_point", None) is None
    assert exercise.check("ridge_point", "twenty") is False
    assert "'twenty'" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs"):
        exercise.ask("ridge_point", peak_flop_s=1e12)
    with pytest.raises(ValueError, match="unknown exercise 'nope'"):
        exercise.check("nope", 1)


def test_setting_search_wants_the_limit_met_without_waste(capsys):
    calls = []

    def p99_ttft(b):
        calls.append(b)
        return 0.2 if b >= 32 else 10.0 * 32 / b
    exercise.ask("max_batch_for_slo", candidates=[4, 8, 16, 32, 64, 128, 256], limit=1.0, rate=3.9, lo=4, hi=256,
                 evaluate=p99_ttft)
    assert exercise.solution("max_batch_for_slo") == 32
    assert exercise.check("max_batch_for_slo", 16) is False    # breaks the SLO
    assert "p99 TTFT 20 s" in capsys.readouterr().out          # and says what that setting gave
    assert exercise.check("max_batch_for_slo", 48) is True     # meets it, within 2x of the smallest
    assert exercise.check("max_batch_for_slo", 256) is False   # meets it, but 8x the batch needed
    assert exercise.check("max_batch_for_slo", 1000) is False  # outside the range offered
    assert len(calls) == len(set(calls))                       # each setting simulated once


def test_threshold_search_rejects_a_lucky_dip_and_identical_only():
    rows = SWEEP + [dict(threshold=0.7, hits=100, true_hits=99, false_hits=1, hit_rate=99 / 125, precision=0.99)]
    exercise.ask("safe_threshold", rows=rows, target=0.99)
    assert exercise.solution("safe_threshold") == 0.905
    assert exercise.check("safe_threshold", 0.7) is False    # 99% there, but 0.8-0.9 let false hits through
    assert exercise.check("safe_threshold", 0.95) is False   # safe, but keeps under 3/4 of the hits
    assert exercise.check("safe_threshold", 0.905) is True


def test_knee_is_the_first_level_past_the_bound_and_levels_are_checked(capsys):
    ctx, _ = CASES["knee_level"]
    exercise.ask("knee_level", **ctx)
    assert exercise.solution("knee_level") == 16
    assert exercise.check("knee_level", 16.0) is True
    assert exercise.check("knee_level", 8) is False
    assert exercise.check("knee_level", 12) is False
    assert "pick one of the levels" in capsys.readouterr().out


def test_choices_take_a_unique_part_of_a_name_and_near_ties_count_as_right(capsys):
    exercise.ask("costlier_knob", options=["slow tokenizer", "heavy RAG"],
                 scores={"slow tokenizer": 20.0, "heavy RAG": 21.0})
    assert exercise.check("costlier_knob", "tokenizer") is True    # within 10% of the larger share
    assert exercise.check("costlier_knob", "RAG") is True
    assert exercise.check("costlier_knob", "e") is False            # both names contain it
    assert "matches 2" in capsys.readouterr().out
    exercise.ask("sparse_faster", sparsity=0.9, options=["dense", "CSR"], times_s={"dense": 1.0, "CSR": 0.95})
    assert exercise.check("sparse_faster", "dense") is True         # 5% apart: the clock cannot tell
    exercise.ask("sparse_faster", sparsity=0.99, options=["dense", "CSR"], times_s={"dense": 1.0, "CSR": 0.2})
    assert exercise.check("sparse_faster", "dense") is False


def test_formula_answers_pass_when_overhead_moves_the_measurement():
    # 1000 ops x 4 us = 4 ms predicted; the loop's own Python made it 10 ms
    exercise.ask("tiny_ops_time", per_op_s=4e-6, ops=1000, measured_s=1e-2)
    assert exercise.check("tiny_ops_time", 4e-3) is True
    assert exercise.check("tiny_ops_time", 1.6e-5) is False          # the arithmetic alone
    # batch 8 on a busy CPU: the roofline says 430 tokens/s, the run made 22 (batch 1: 17)
    exercise.ask("decode_tok_s_batched", batch=8, tok_s_b1=17.0, measured_tok_s=22.0, roofline_tok_s=430.0)
    assert exercise.check("decode_tok_s_batched", 400) is True       # right from the ceilings
    assert exercise.check("decode_tok_s_batched", 30) is True        # right about this run
    assert exercise.check("decode_tok_s_batched", 8 * 17) is False   # neither
    # distillation: FLOPs say 1.67x; a noisy smoke run measured 2.4x
    exercise.ask("distill_cost", student_layers=2, teacher_layers=4, flop_ratio=1.67, seconds_ratio=2.4)
    assert exercise.check("distill_cost", 5 / 3) is True
    assert exercise.check("distill_cost", 2.0) is True
    assert exercise.check("distill_cost", 1.0) is False


def test_breakeven_is_bracketed_by_the_sweep_and_never_is_an_answer():
    exercise.ask("csr_breakeven", sweep=[0.5, 0.7, 0.8, 0.9, 0.95, 0.99], rows=BREAKEVEN)
    assert 0.8 <= exercise.solution("csr_breakeven") <= 0.9
    assert exercise.check("csr_breakeven", 0.85) is True
    assert exercise.check("csr_breakeven", 0.95) is False            # it already won at 90%
    assert exercise.check("csr_breakeven", 1.0) is False
    assert exercise.check("csr_breakeven", 85) is False              # a percentage, not a fraction
    never = [dict(r, csr_over_dense=r["csr_over_dense"] + 1.0) for r in BREAKEVEN]
    exercise.ask("csr_breakeven", sweep=[0.5, 0.7, 0.8, 0.9, 0.95, 0.99], rows=never)
    assert exercise.check("csr_breakeven", exercise.solution("csr_breakeven")) is True
    assert exercise.check("csr_breakeven", 1.0) is True
    assert exercise.check("csr_breakeven", 0.9) is False


def test_sensitive_layer_by_damage_not_by_name(capsys):
    ctx, _ = CASES["keep_in_high_precision"]
    exercise.ask("keep_in_high_precision", **ctx)
    assert exercise.solution("keep_in_high_precision") == "output"
    assert exercise.check("keep_in_high_precision", "OUTPUT") is True
    assert "+0.40% perplexity" in capsys.readouterr().out
    close = dict(ctx, sensitivity={**ctx["sensitivity"], "layers.0.feed_forward.w2": 0.3})
    exercise.ask("keep_in_high_precision", **close)
    assert exercise.check("keep_in_high_precision", "w2") is True    # 3/4 of the worst: also worth keeping


def test_selftest_mode_judges_the_reference_on_an_unanswered_check(monkeypatch):
    monkeypatch.setenv(exercise.SELFTEST_ENV, "1")
    exercise.ask("ridge_point", peak_flop_s=1e12, bandwidth=5e10)
    assert exercise.check("ridge_point", None) is None
    exercise.ask("csr_breakeven", sweep=[0.5], rows=[{"sparsity": 0.5, "csr_over_dense": 2.0}])
    monkeypatch.setitem(exercise.EXERCISES, "csr_breakeven",
                        exercise.dataclasses.replace(exercise.EXERCISES["csr_breakeven"], solve=lambda c: 0.1))
    with pytest.raises(AssertionError, match="fails its own check"):
        exercise.check("csr_breakeven", None)


def test_every_exercise_is_asked_and_checked_in_its_notebook_and_each_chapter_has_two_to_four():
    import collections
    import json
    from pathlib import Path

    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    per_notebook = collections.Counter(e.notebook for e in exercise.EXERCISES.values())
    for name, e in exercise.EXERCISES.items():
        cells = json.loads((notebooks / f"{e.notebook}.ipynb").read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert f'exercise.ask("{name}"' in code and f'exercise.check("{name}"' in code, (e.notebook, name)
    assert {p.stem for p in notebooks.glob("[0-9][0-9]_*.ipynb")} == set(per_notebook)
    assert all(2 <= n <= 4 for n in per_notebook.values()), per_notebook
