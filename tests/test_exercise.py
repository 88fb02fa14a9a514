"""Every exercise: its reference answer passes its own check, a plausible wrong one fails."""

import pytest

from labkit import exercise

# name -> (this run's measurements, a plausible wrong answer)
CASES = {
    "cold_over_warm": ({"cold_first_s": 0.05, "warm_median_s": 0.001}, 1.0),
    "mean_or_median": ({"mean_s": 0.02, "median_s": 0.0011, "typical_s": 0.001}, "median"),
    "decode_tok_s_batch1": ({"weight_bytes": 4e8, "bandwidth": 4e10, "measured_tok_s": 80.0}, 1000.0),
    "decode_tok_s_batch8": ({"tok_s_b1": 80.0, "measured_tok_s_b8": 560.0}, 80.0),
    "ridge_point": ({"peak_flop_s": 1e12, "bandwidth": 5e10}, 2.0),
    "kernel_bound": ({"intensity": 0.25, "peak_flop_s": 1e12, "bandwidth": 5e10}, "compute"),
    "tiny_ops_time": ({"per_op_s": 4e-6, "ops": 1000, "measured_s": 4.4e-3}, 4e-5),
    "int8_bytes_ratio": ({"int8_bytes": 2.6e6, "fp32_bytes": 1e7}, 0.5),
    "keep_in_high_precision": ({"layers": ["q", "k", "down"], "sensitivity": {"q": 0.1, "k": 0.2, "down": 3.0}}, "q"),
    "sparse_faster": ({"sparsity": 0.5, "dense_s": 1.0, "csr_s": 3.0}, "csr"),
    "max_batch_for_slo": ({"candidates": [1, 2, 4, 8, 16, 32], "limit": 1.0,
                           "evaluate": lambda b: 0.1 * b}, 2),
    "kv_bytes_per_token": ({"layers": 4, "kv_heads": 2, "head_dim": 32, "dtype_bytes": 4,
                            "measured_bytes_per_token": 2048}, 1024),
    "tail_or_mean": ({"mean_a": 1.0, "mean_b": 0.7, "p99_a": 5.0, "p99_b": 4.75}, "p99"),
    "tail_cause": ({"spans": ["queue", "preprocess", "model"],
                    "p99_span_s": {"queue": 0.8, "preprocess": 0.3, "model": 0.1}}, "model"),
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


def test_setting_search_rejects_a_setting_that_breaks_the_limit():
    exercise.ask("max_batch_for_slo", candidates=[1, 2, 4, 8, 16], limit=1.0, evaluate=lambda b: 0.1 * b)
    assert exercise.solution("max_batch_for_slo") == 8
    assert exercise.check("max_batch_for_slo", 16) is False   # breaks the SLO
    assert exercise.check("max_batch_for_slo", 4) is True     # meets it, half the best or more
