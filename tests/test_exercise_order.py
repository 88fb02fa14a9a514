"""Exercises ask before they tell: in every notebook the learner writes the guess before any
cell shows the answer.

An exercise is a markdown "Your turn (`name`)" cell, a code cell `guess_x = None`, and a cell
calling `exercise.check("name", guess_x)` (usually with `exercise.ask`). For each exercise this
test reads the committed notebook's cell order (no run) and asserts:

* the "Your turn" cell and then the guess cell come before the check cell;
* no cell from the notebook's start up to the guess cell reveals the answer. "Reveals" is the
  list of regexes in REVEALS below: the call or variable that prints this run's answer or the
  prediction equal to it, the formula that gives it, or prose naming the result. An `ask` cell
  may sit before the guess (it prints the question only) as long as it matches none of them.

A new exercise needs an entry in REVEALS (the first test checks it).
"""

import json
import re
from pathlib import Path

import pytest

from labkit import exercise

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

# Before the guess, no notebook cell may look up the reference answer.
ALWAYS = (r"exercise\.solution\(",)

# name -> regexes a cell before the guess must not match (searched in the cell's source, case as given).
REVEALS: dict[str, tuple[str, ...]] = {
    # 00 setup
    "cold_over_warm": (r"\bcold_ratio\b", r"first_calls\("),
    "mean_or_median": (r"\bcold_stats\b", r"(?i)pulled up", r"(?i)(needs|reports)[^.\n]{0,30}\bthe median\b"),
    # 01 prefill vs decode
    "decode_tok_s_batch1": (r"time_decode\(", r"\btok_s\[", r"pred_decode\[[^\]]*\]\[.time_s.\]"),
    "decode_tok_s_batched": (r"time_decode\(", r"\btok_s\[", r"roofline_tok_s", r"pred_decode\[[^\]]*\]\[.time_s.\]"),
    "costlier_knob": (r"measure_c2\(", r"\bshares\[", r"(?i)heavy (rag|retrieval)[^.\n]*(more|larger) than[^.\n]*tokenizer"),
    # 02 roofline
    "ridge_point": (r"\.ridge\(", r"ch2\.predict_c4\("),
    "kernel_bound": (r"\bdefault_pt\b", r"pt16\[.predicted.\]", r"draw_decode\("),
    "batch_to_ridge": (r"\bb_ridge\b", r"(?i)compute-bound from batch", r"draw_decode\("),
    # 03 fusion
    "tiny_ops_time": (r"predict_c6\(", r"measure_c6\(", r"(?i)time\s*≈\s*ops", r"(?i)takes milliseconds"),
    "fusion_gain": (r"predict_c7\(", r"measure_c7\(", r"(?i)\b\d+ reads\b"),
    # 04 quantization
    "int8_bytes_ratio": (r"(?i)a quarter", r"8/32", r"c10_bytes\(", r"predict_c10\("),
    "keep_in_high_precision": (r"(?i)fp32 output", r"(?i)output head", r"sensitivity_scan\(", r"\[.kept.\]"),
    "kv_int8_fit": (r"head_dim \+ 4", r"4 \* head_dim", r"kv_table\(", r"\bkv8\["),
    # 05 pruning, distillation
    "sparse_faster": (r"matmul_rows\(", r"\bt_mm\b"),
    "csr_breakeven": (r"breakeven_sweep\(", r"\[.breakeven.\]"),
    "distill_cost": (r"predict_c14\(", r"distill_vs_scratch\(", r"F_student", r"(?i)training FLOP ratio",
                     r"(?i)roughly doubles"),
    # 06 batching
    "md1_wait": (r"W_q\s*=", r"rho\s*/\s*\(\s*2", r"\bwq09\b"),
    "short_wait_scheduler": (r"\be2e_short\b", r"ex\.compare\(wl\b", r"(?i)static batching makes short",
                             r"(?i)why static"),
    "max_batch_for_slo": (r"(?i)smallest max_batch (is|=)",),
    # 07 KV and result cache
    "kv_bytes_per_token": (r"\\text\{bytes per token\}\s*=", r"kvm\.kv_bytes_per_token\(", r"\.nbytes\b"),
    "int8_concurrency": (r"kv_dtype=\"int8\", seed", r"int8\[.peak_running.\]"),
    "safe_threshold": (r"describe_safe\(", r"\[.safe.\]"),
    # 08 p99 and load
    "knee_level": (r"first_past\(", r"sweep_panels\(", r"judge_c20\("),
    "tail_or_mean": (r"predict_cache_effect\(", r"\bpred19\b", r"predict_c19\(", r"\bch19\b", r"(?i)hardly moves",
                     r"(?i)mean hides the tail", r"(?i)through a lighter load", r"(?i)tail is made of"),
    # 09 case study
    "tail_cause": (r"span_breakdown\(", r"(?i)not safe for concurrent use", r"(?i)cause: a pre-processing",
                   r"(?i)\block\b", r"global_lock"),
    "locked_capacity": (r"(?i)\b1\s*/\s*(d|hold)", r"(?i)capacity is 1", r"serial_rps:"),
    "queue_bound": (r"(?i)capacity\s*[×x*]\s*\(SLO", r"case\.queue_bound\("),
}

# Exercises whose notebook does not conform yet, each with its owner's pending fix. xfail(strict):
# once fixed the test XPASSes and fails, so the entry must then be removed. Empty it, don't grow it.
PENDING: set[tuple[str, str]] = set()


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def order_problems(cells: list[dict], reveals: dict[str, tuple[str, ...]]) -> list[str]:
    """What is wrong with the order of the exercises `reveals` names in a notebook's `cells`
    (nbformat dicts); empty when each guess comes first."""
    out = []
    for name, patterns in reveals.items():
        checks = [(i, m.group(1)) for i, c in enumerate(cells) if c["cell_type"] == "code"
                  for m in [re.search(rf'exercise\.check\("{re.escape(name)}",\s*(\w+)\)', _source(c))] if m]
        if len(checks) != 1:
            out.append(f"{name}: {len(checks)} cells call exercise.check({name!r}, <guess>); want one")
            continue
        check_at, var = checks[0]
        guess_at = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"
                         and re.search(rf"^{var}\s*=\s*None\b", _source(c), re.M)), None)
        if guess_at is None:
            out.append(f"{name}: no code cell sets `{var} = None`")
            continue
        if guess_at >= check_at:
            out.append(f"{name}: the guess cell ({guess_at}) must come before the check cell ({check_at})")
        turn_at = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                        and "Your turn" in _source(c) and f"`{name}`" in _source(c)), None)
        if turn_at is None or turn_at > guess_at:
            out.append(f"{name}: no 'Your turn (`{name}`)' markdown before the guess cell ({guess_at})")
        for i, c in enumerate(cells[: guess_at + 1]):
            for pat in (*patterns, *ALWAYS):
                m = re.search(pat, _source(c))
                if m:
                    out.append(f"{name}: cell {i} ({c['cell_type']}) reveals the answer before the guess "
                               f"(cell {guess_at}): {m.group(0)!r} matches {pat!r}")
    return out


def _cells(stem: str) -> list[dict]:
    return json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]


def test_every_exercise_declares_what_reveals_it():
    assert set(REVEALS) == set(exercise.EXERCISES)
    assert all(REVEALS.values())
    assert PENDING <= {(e.notebook, n) for n, e in exercise.EXERCISES.items()}


CASES = [pytest.param(e.notebook, name, id=f"{e.notebook}-{name}",
                      marks=[pytest.mark.xfail(strict=True, reason="owner's fix pending")]
                      if (e.notebook, name) in PENDING else [])
         for name, e in sorted(exercise.EXERCISES.items(), key=lambda kv: (kv[1].notebook, kv[0]))]


@pytest.mark.parametrize("stem,name", CASES)
def test_guess_comes_before_anything_that_reveals_the_answer(stem, name):
    assert order_problems(_cells(stem), {name: REVEALS[name]}) == []


# ------------------------------------------------------------------ the check itself can fail
def _md(text: str) -> dict:
    return {"cell_type": "markdown", "source": text}


def _code(text: str) -> dict:
    return {"cell_type": "code", "source": text}


GOOD = [_md("## M/D/1"),
        _md("**Your turn (`md1_wait`).** At rho = 0.9, what mean wait do you expect?"),
        _code("guess_wq = None  # seconds"),
        _md("Theory: $W_q = \\rho / (2\\mu(1-\\rho))$."),
        _code("wq09 = simulate()\nexercise.ask(\"md1_wait\", simulated_wq_s=wq09)\nexercise.check(\"md1_wait\", guess_wq)")]


def test_a_notebook_that_asks_first_passes():
    assert order_problems(GOOD, {"md1_wait": REVEALS["md1_wait"]}) == []


def test_a_formula_before_the_guess_fails():
    told_first = [GOOD[0], GOOD[3], GOOD[1], GOOD[2], GOOD[4]]
    problems = order_problems(told_first, {"md1_wait": REVEALS["md1_wait"]})
    assert problems and all("cell 1 (markdown) reveals" in p for p in problems)
    assert any("'W_q ='" in p for p in problems)


def test_a_printed_answer_before_the_guess_fails():
    printed = [GOOD[0], _code("wq09 = simulate()\nprint(wq09)"), *GOOD[1:3], GOOD[4]]
    problems = order_problems(printed, {"md1_wait": REVEALS["md1_wait"]})
    assert any("cell 1 (code) reveals" in p and "wq09" in p for p in problems)


def test_a_guess_after_its_check_or_missing_fails():
    late = [GOOD[0], GOOD[1], GOOD[4], GOOD[2]]
    assert any("must come before the check" in p for p in order_problems(late, {"md1_wait": ()}))
    assert any("no code cell sets `guess_wq = None`" in p
               for p in order_problems([GOOD[1], GOOD[4]], {"md1_wait": ()}))
    no_turn = [GOOD[2], GOOD[4]]
    assert any("no 'Your turn" in p for p in order_problems(no_turn, {"md1_wait": ()}))


def test_looking_up_the_solution_before_the_guess_fails():
    peek = [_code("print(exercise.solution(\"md1_wait\"))"), *GOOD]
    assert any("cell 0 (code) reveals" in p and "solution(" in p for p in order_problems(peek, {"md1_wait": ()}))
