""""Your turn" exercises: the learner predicts a number, picks a setting or names a cause,
and `check` judges the answer against *this run's* measurements.

A notebook hands the measurements an exercise needs to `ask`, which prints the question:

    exercise.ask("decode_tok_s_batch1", weight_bytes=..., bandwidth=..., measured_tok_s=...)
    answer = None   # <- your prediction, in tokens/s
    exercise.check("decode_tok_s_batch1", answer)

Tolerances are ratios, regimes and orderings, never fixed numbers, so the same answer
logic holds on a laptop and on an H100. A miss prints a hint; a hit prints one line on why.
Reference answers stay out of sight: hosts call `solution(name)` (computed from the same
context). Executed headless, `answer = None` prints the question and is not an error.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Callable, Mapping

from labkit.knee import first_past
from labkit.stats import safe_threshold

Ctx = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Exercise:
    name: str
    notebook: str
    question: str            # formatted with the context
    needs: tuple[str, ...]   # context keys `ask` must receive
    solve: Callable[[Ctx], Any]
    judge: Callable[[Any, Any, Ctx], bool]   # (answer, reference, ctx) -> right?
    hint: str
    why: str
    detail: Callable[[Any, Ctx], str] | None = None   # (answer, ctx) -> what this answer gives here


# ------------------------------------------------------------------ tolerance kinds
def within_factor(f: float) -> Callable[[Any, Any, Ctx], bool]:
    """Right if answer and reference are positive and within a factor `f` of each other."""
    def judge(answer: Any, ref: Any, ctx: Ctx) -> bool:
        a = float(answer)
        return a > 0 and max(a / ref, ref / a) <= f
    return judge


def same_choice(answer: Any, ref: Any, ctx: Ctx) -> bool:
    return str(answer).strip().lower() == str(ref).strip().lower()


def meets_limit_and_not_wasteful(answer: Any, ref: Any, ctx: Ctx) -> bool:
    """A setting search for the smallest setting that meets a limit: the answer must meet the
    limit and be at most twice the smallest candidate that does (so the largest setting on offer
    is not a right answer to "find the smallest batch")."""
    a = int(answer)
    lo, hi = min(ctx["candidates"]), max(ctx["candidates"])
    if not lo <= a <= hi:
        raise ValueError(f"pick a value from {lo} to {hi}")
    return ctx["evaluate"](a) <= ctx["limit"] and a <= 2 * ref


def _smallest_meeting(ctx: Ctx) -> int:
    ok = [c for c in sorted(ctx["candidates"]) if ctx["evaluate"](c) <= ctx["limit"]]
    if not ok:
        raise ValueError(f"no candidate in {list(ctx['candidates'])} meets the limit {ctx['limit']}")
    return ok[0]


def _evaluated(answer: Any, ctx: Ctx) -> str:
    a = int(answer)
    return f"max_batch {a}: p99 TTFT {ctx['evaluate'](a):.3g} s (limit {ctx['limit']:.3g} s)"


def _safe_threshold(ctx: Ctx) -> float:
    """Lowest threshold from which every higher threshold that still hits keeps precision >= target."""
    best = safe_threshold(ctx["rows"], ctx["target"])
    if best is None:
        raise ValueError(f"no threshold keeps hit precision >= {ctx['target']:.0%}")
    return best["threshold"]


def _row_at(ctx: Ctx, t: float) -> dict:
    return min(ctx["rows"], key=lambda r: abs(r["threshold"] - t))


def _safe_and_useful(answer: Any, ref: Any, ctx: Ctx) -> bool:
    """Every threshold from the answer up keeps the precision target, and the answer keeps at
    least 3/4 of the reference threshold's hit rate (1.0, "identical prompts only", is safe but
    useless)."""
    t = float(answer)
    if not 0 <= t <= 1:
        raise ValueError("a cosine threshold lies between 0 and 1")
    safe = all(r["precision"] >= ctx["target"] for r in ctx["rows"] if r["threshold"] >= t - 1e-9 and r["hits"])
    return safe and _row_at(ctx, t)["hit_rate"] >= 0.75 * _row_at(ctx, ref)["hit_rate"]


def _threshold_detail(answer: Any, ctx: Ctx) -> str:
    r = _row_at(ctx, float(answer))
    return f"at {r['threshold']:.3f}: hit rate {r['hit_rate']:.1%}, precision {r['precision']:.1%}"


def _knee_level(ctx: Ctx) -> float:
    """The ledger's knee: the first level whose p99 E2E exceeds `factor` x the lightest's."""
    k = first_past([{"level": lvl, "e2e": {"p99": p}} for lvl, p in ctx["p99_by_level"].items()], "level",
                   ctx["factor"])
    if k is None:
        raise ValueError("no level passed the bound: the sweep has no knee")
    return k["level"]


def _same_level(answer: Any, ref: Any, ctx: Ctx) -> bool:
    a = float(answer)
    if a not in ctx["p99_by_level"]:
        raise ValueError(f"pick one of the levels {sorted(ctx['p99_by_level'])}")
    return a == ref


def _level_detail(answer: Any, ctx: Ctx) -> str:
    p99 = dict(sorted(ctx["p99_by_level"].items()))
    base = next(iter(p99.values()))
    return f"at {float(answer):g} p99 E2E is {p99[float(answer)] / base:.2f}x the lightest level's"


def _bound(ctx: Ctx) -> str:
    return "memory" if ctx["intensity"] < ctx["peak_flop_s"] / ctx["bandwidth"] else "compute"


def _option(answer: Any, options: Any) -> str:
    """The option `answer` names: its exact name or a unique part of one (case-insensitive)."""
    a = str(answer).strip().lower()
    names = list(options)
    exact = [o for o in names if str(o).lower() == a]
    if exact:
        return exact[0]
    part = [o for o in names if a and a in str(o).lower()]
    if len(part) != 1:
        raise ValueError(f"name one of {names}" + (f" ({answer!r} matches {len(part)})" if part else ""))
    return part[0]


def _largest_within(tie: float) -> Callable[[Any, Any, Ctx], bool]:
    """Right if the named option's `score` is within a relative `tie` of the largest score: two
    options the measurement cannot tell apart are both right answers."""
    def judge(answer: Any, ref: Any, ctx: Ctx) -> bool:
        scores = ctx["scores"]
        return scores[_option(answer, scores)] >= (1 - tie) * max(scores.values())
    return judge


def _scores_detail(answer: Any, ctx: Ctx) -> str:
    return "measured: " + ", ".join(f"{k} {v:.3g}" for k, v in ctx["scores"].items())


def _number_or_formula(f_measured: float, f_formula: float, formula: Callable[[Ctx], float],
                       measured: str) -> Callable[[Any, Any, Ctx], bool]:
    """Right within `f_measured` of this run's measurement, or within `f_formula` of the
    prediction the question asks for (so a learner who computes it exactly is not failed by
    overhead the formula leaves out)."""
    def judge(answer: Any, ref: Any, ctx: Ctx) -> bool:
        return (within_factor(f_measured)(answer, ctx[measured], ctx)
                or within_factor(f_formula)(answer, formula(ctx), ctx))
    return judge


def _most_sensitive(answer: Any, ref: Any, ctx: Ctx) -> bool:
    """Right if the named layer's measured damage is at least half the worst layer's."""
    dmg = ctx["sensitivity"]
    return dmg[_option(answer, ctx["layers"])] >= 0.5 * max(dmg.values())


def _sensitivity_detail(answer: Any, ctx: Ctx) -> str:
    name = _option(answer, ctx["layers"])
    worst = max(ctx["layers"], key=lambda n: ctx["sensitivity"][n])
    return (f"{name} alone: {ctx['sensitivity'][name]:+.2f}% perplexity; the worst, {worst}: "
            f"{ctx['sensitivity'][worst]:+.2f}%")


def _faster(ctx: Ctx) -> str:
    return min(ctx["times_s"], key=ctx["times_s"].get)


def _faster_within(tie: float) -> Callable[[Any, Any, Ctx], bool]:
    """Right if the named variant's time is within a relative `tie` of the fastest one's."""
    def judge(answer: Any, ref: Any, ctx: Ctx) -> bool:
        t = ctx["times_s"]
        return t[_option(answer, t)] <= (1 + tie) * min(t.values())
    return judge


def _times_detail(answer: Any, ctx: Ctx) -> str:
    return "measured: " + ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in ctx["times_s"].items())


def _breakeven_bracket(ctx: Ctx) -> tuple[float, float]:
    """(last sparsity where CSR lost before its first win, first sparsity where it won); (max, 1) if
    it never won in the sweep. `rows`: sparsity and csr_over_dense (> 1: CSR slower)."""
    rows = sorted(ctx["rows"], key=lambda r: r["sparsity"])
    for i, r in enumerate(rows):
        if r["csr_over_dense"] <= 1:
            return (rows[i - 1]["sparsity"] if i else 0.0), r["sparsity"]
    return rows[-1]["sparsity"], 1.0


def _breakeven_solution(ctx: Ctx) -> float:
    lo, hi = _breakeven_bracket(ctx)
    return round((lo + hi) / 2, 3)


def _in_bracket(answer: Any, ref: Any, ctx: Ctx) -> bool:
    a = float(answer)
    if not 0 <= a <= 1:
        raise ValueError("a sparsity lies between 0 and 1 (0.9 = 90% zeros)")
    lo, hi = _breakeven_bracket(ctx)
    return lo <= a <= hi


def _breakeven_detail(answer: Any, ctx: Ctx) -> str:
    lo, hi = _breakeven_bracket(ctx)
    if hi == 1.0:
        return f"CSR lost at every sparsity of the sweep, up to {lo:.0%}"
    return f"CSR lost at {lo:.0%} and won at {hi:.0%}" if lo else f"CSR already won at {hi:.0%}"


EXERCISES: dict[str, Exercise] = {e.name: e for e in [
    Exercise("cold_over_warm", "00_setup",
             "The first call of a fresh shape paid one-off costs. Predict: how many times slower than the warm "
             "median was call 0? (a number)", ("cold_first_s", "warm_median_s"),
             lambda c: c["cold_first_s"] / c["warm_median_s"], within_factor(3.0),
             "Look at the plot's first point against the dashed warm line.",
             "first calls page-fault fresh memory and pick kernels; the warm median excludes that"),
    Exercise("mean_or_median", "00_setup",
             "Over the un-warmed calls, which statistic is pulled further from the typical call: 'mean' or "
             "'median'?", ("mean_s", "median_s", "typical_s"),
             lambda c: "mean" if abs(c["mean_s"] - c["typical_s"]) > abs(c["median_s"] - c["typical_s"]) else "median",
             same_choice, "A few slow cold calls: which statistic do outliers move?",
             "a handful of slow calls moves the mean; the median only moves if half the calls do"),
    # ---------------------------------------------------------------- 01 prefill vs decode
    Exercise("decode_tok_s_batch1", "01_prefill_vs_decode",
             "Decode reads every weight once per step. From the measured bandwidth ({bandwidth:.3g} B/s) and "
             "the weight bytes ({weight_bytes:.3g} B), predict decode tokens/s at batch 1.",
             ("weight_bytes", "bandwidth", "measured_tok_s"),
             lambda c: c["bandwidth"] / c["weight_bytes"],
             lambda a, ref, c: within_factor(1.3)(a, ref, c) or within_factor(1.5)(a, c["measured_tok_s"], c),
             "tokens/s ~= bandwidth / bytes read per step.",
             "batch-1 decode is bandwidth over weight bytes; where the run was slower than that, per-step "
             "overhead (chapter 3) took the difference"),
    Exercise("decode_tok_s_batched", "01_prefill_vs_decode",
             "At batch {batch} one step reads the weights once but makes {batch} tokens, with {batch}x the FLOPs. "
             "Batch 1 made {tok_s_b1:.0f} tokens/s here. Predict decode tokens/s at batch {batch}.",
             ("batch", "tok_s_b1", "measured_tok_s", "roofline_tok_s"),
             lambda c: c["measured_tok_s"],
             _number_or_formula(1.6, 1.3, lambda c: c["roofline_tok_s"], "measured_tok_s"),
             "From the ceilings: one step takes max(FLOPs / peak, bytes / bandwidth) and makes `batch` tokens. "
             "Memory-bound, the step time barely grows with the batch; past the ridge, FLOPs set it.",
             "weight reads are shared by the batch, so tokens/s grows almost with batch until the step "
             "reaches the ridge; where the run fell short of the roofline, per-op work (chapter 3) or a busy "
             "machine took the difference"),
    Exercise("costlier_knob", "01_prefill_vs_decode",
             "Two ways to make the typical request path costly outside the model: {options}. Which one puts "
             "the larger share of the request's time outside the model here?", ("options", "scores"),
             lambda c: max(c["scores"], key=c["scores"].get), _largest_within(0.1),
             "Compare the pre share of those two rows in the span tables above: BM25 over every passage vs a "
             "tokenizer written in Python.",
             "time the whole path before tuning the model: the costlier knob is the first fix",
             _scores_detail),
    # ---------------------------------------------------------------- 02 roofline
    Exercise("ridge_point", "02_roofline",
             "From this machine's measured peak ({peak_flop_s:.3g} FLOP/s) and bandwidth ({bandwidth:.3g} B/s), "
             "what is the ridge point in FLOP/byte?", ("peak_flop_s", "bandwidth"),
             lambda c: c["peak_flop_s"] / c["bandwidth"], within_factor(1.15),
             "ridge = peak / bandwidth.", "below the ridge a kernel cannot feed the ALUs fast enough"),
    Exercise("kernel_bound", "02_roofline",
             "{kernel} does {intensity:.3g} FLOP per byte. On this machine is it 'memory' or 'compute' bound?",
             ("kernel", "intensity", "peak_flop_s", "bandwidth"), _bound, same_choice,
             "Compare its intensity with the ridge point (peak / bandwidth).",
             "the side of the ridge decides which ceiling a kernel can reach"),
    Exercise("batch_to_ridge", "02_roofline",
             "A decode linear {d}x{d} in {dtype} ({itemsize} bytes per value) reads its weight once per step "
             "whatever the batch. From which batch is it compute-bound on this machine (ridge "
             "{ridge:.3g} FLOP/B)?", ("d", "dtype", "itemsize", "ridge", "batch_at_ridge"),
             lambda c: c["batch_at_ridge"], within_factor(1.3),
             "FLOPs = 2 x batch x d x d; bytes ~= d x d x itemsize (the weight). Set FLOPs / bytes = ridge and "
             "solve for the batch.",
             "batching B requests multiplies the intensity by ~B; past the ridge, a bigger batch costs compute"),
    # ---------------------------------------------------------------- 03 fusion
    Exercise("tiny_ops_time", "03_fusion",
             "One eager op costs {per_op_s:.3g} s here. Predict the time of {ops} tiny ops in a row, in seconds.",
             ("per_op_s", "ops", "measured_s"), lambda c: c["measured_s"],
             _number_or_formula(2.0, 1.25, lambda c: c["ops"] * c["per_op_s"], "measured_s"),
             "When the ops do almost no arithmetic, time ~= ops x per-op cost.",
             "tiny ops are pure dispatch cost, which fusion and graphs remove"),
    Exercise("fusion_gain", "03_fusion",
             "Of the chains {options}, which gains more from fusion here (eager time / fused time)?",
             ("options", "scores"), lambda c: max(c["scores"], key=c["scores"].get), _largest_within(0.1),
             "Count the full-size tensors each eager chain writes and reads back (its kernels): fusion saves "
             "those round trips, and every one of them is a fresh output tensor.",
             "the chain with more eager kernels moves more intermediates through memory, and fusion removes them",
             _scores_detail),
    # ---------------------------------------------------------------- 04 quantization
    Exercise("int8_bytes_ratio", "04_quantization",
             "int8 weights take 1 byte and a small scale per row. Predict int8's weight bytes per decode step "
             "as a fraction of fp32's.", ("int8_bytes", "fp32_bytes"), lambda c: c["int8_bytes"] / c["fp32_bytes"],
             within_factor(1.1), "fp32 takes 4 bytes per weight.",
             "a quarter, not a half: fp32 -> int8 is 4x fewer bytes (fp16 -> int8 halves)"),
    Exercise("keep_in_high_precision", "04_quantization",
             "Quantized to int4 one at a time, which of these layers would you keep in higher precision? "
             "Pick from {layers}.", ("layers", "sensitivity"),
             lambda c: max(c["layers"], key=lambda n: c["sensitivity"][n]), _most_sensitive,
             "Which layer does every token's prediction pass through last, with no residual path to soften "
             "its error?",
             "mixed precision spends bytes where the measured damage is largest", _sensitivity_detail),
    Exercise("kv_int8_fit", "04_quantization",
             "A KV vector of head_dim {head_dim} takes 4 x {head_dim} bytes in fp32; int8 stores {head_dim} "
             "codes plus one 4-byte fp32 scale. How many times more tokens fit in the same KV memory with int8?",
             ("head_dim", "fp32_bytes_per_token", "int8_bytes_per_token"),
             lambda c: c["fp32_bytes_per_token"] / c["int8_bytes_per_token"], within_factor(1.05),
             "4 x head_dim / (head_dim + 4): the scale is not free for short vectors.",
             "the per-vector scale costs 4 bytes, so int8 KV fits a little under 4x the tokens"),
    # ---------------------------------------------------------------- 05 pruning, distillation
    Exercise("sparse_faster", "05_pruning_distillation",
             "At {sparsity:.0%} unstructured sparsity, which multiplies faster here: {options}?",
             ("sparsity", "options", "times_s"), _faster, _faster_within(0.1),
             "Dense hardware streams dense weights well; CSR adds a 4-byte index per value and irregular reads.",
             "unstructured zeros do not shrink dense work; sparse formats win only at very high sparsity",
             _times_detail),
    Exercise("csr_breakeven", "05_pruning_distillation",
             "The sweep timed CSR against dense at sparsities {sweep}. From which sparsity (a fraction, "
             "0.9 = 90% zeros) does CSR win here? Answer 1.0 if you think it never wins in the sweep.",
             ("sweep", "rows"), _breakeven_solution, _in_bracket,
             "Bytes alone say 50% (8 bytes per non-zero vs 4 per dense weight); irregular reads push it higher.",
             "CSR pays only once so few values are left that its scattered reads cost less than the dense stream",
             _breakeven_detail),
    Exercise("distill_cost", "05_pruning_distillation",
             "The student has {student_layers} layers, the teacher {teacher_layers}. Predict distillation's "
             "training time as a multiple of training the same student from scratch.",
             ("student_layers", "teacher_layers", "flop_ratio", "seconds_ratio"),
             lambda c: c["seconds_ratio"],
             _number_or_formula(1.3, 1.15, lambda c: c["flop_ratio"], "seconds_ratio"),
             "A training step costs ~3 student forwards; distillation adds one teacher forward "
             "(teacher layers / student layers of a student forward).",
             "the teacher's forward is the extra cost: (3 + teacher/student) / 3 of from-scratch training"),
    Exercise("md1_wait", "06_batching",
             "No batching, Poisson arrivals, a fixed {service_s:g} s service time, load rho = {rho:g}. Predict the "
             "mean wait in the queue, in seconds.", ("rho", "service_s", "simulated_wq_s"),
             lambda c: c["simulated_wq_s"], within_factor(1.25),
             "M/D/1: Wq = rho x service / (2 (1 - rho)). The M/M/1 formula (no 2) is for random service times.",
             "a fixed service time halves M/M/1's wait; near rho = 1 the 1 / (1 - rho) term explodes"),
    Exercise("short_wait_scheduler", "06_batching",
             "Of the batching schedulers {schedulers}, which makes the shortest quarter of outputs wait longest "
             "(mean E2E)?", ("schedulers", "short_e2e_s"),
             lambda c: max(c["schedulers"], key=lambda k: c["short_e2e_s"][k]), same_choice,
             "Who leaves a batch when the longest member is done, and who lets nobody join until it drains?",
             "static batching pads and holds everyone until the longest output is done, so short answers wait "
             "for long ones"),
    Exercise("max_batch_for_slo", "06_batching",
             "Continuous batching at {rate:.3g} req/s: find the smallest max_batch (between {lo} and {hi}) that keeps "
             "p99 TTFT under {limit:.3g} s in this simulator.", ("candidates", "evaluate", "limit", "rate", "lo", "hi"),
             _smallest_meeting, meets_limit_and_not_wasteful,
             "Try values: each `exercise.check('max_batch_for_slo', b)` runs the simulator with max_batch b and "
             "prints its p99 TTFT. Too small a batch cannot keep up and the queue grows; a lot more than needed "
             "only costs memory.",
             "below that batch the server's throughput is under the offered rate, so the queue (and TTFT) grows "
             "without bound; above it new requests start at the next step",
             _evaluated),
    Exercise("kv_bytes_per_token", "07_kv_and_result_cache",
             "The model has {layers} layers, {kv_heads} KV heads of size {head_dim}, {dtype_bytes} bytes per "
             "value. Predict KV-cache bytes per token.", ("layers", "kv_heads", "head_dim", "dtype_bytes",
                                                           "measured_bytes_per_token"),
             lambda c: c["measured_bytes_per_token"], within_factor(1.05),
             "keys and values: 2 x layers x kv_heads x head_dim x bytes.",
             "every token keeps a key and a value per layer and KV head"),
    Exercise("int8_concurrency", "07_kv_and_result_cache",
             "In one KV budget, {base_seqs} sequences ran at once at {base_bytes_per_token} B/token. int8 KV takes "
             "{int8_bytes_per_token} B/token. Predict how many run at once with int8 KV in the same bytes.",
             ("base_seqs", "base_bytes_per_token", "int8_bytes_per_token", "int8_seqs"),
             lambda c: c["int8_seqs"], within_factor(1.3),
             "Sequences that fit scale with budget / bytes per token: base sequences x (base B/token / int8 B/token).",
             "a fixed budget holds (base B/token / int8 B/token) times the tokens; block rounding and the request "
             "mix take a little of that back"),
    Exercise("safe_threshold", "07_kv_and_result_cache",
             "Cosine + guard: pick the threshold that reuses as many answers as possible while every threshold "
             "from it up keeps hit precision >= {target:.0%}.", ("rows", "target"),
             _safe_threshold, _safe_and_useful,
             "In the plot's top panel, follow the guard's curve from the right: go left until wrong hits first rise "
             "above the dotted line; the threshold just before that is the lowest safe one.",
             "below it some false hit slips through; above it you give up paraphrases that were safe to reuse",
             _threshold_detail),
    Exercise("knee_level", "08_p99_and_load",
             "Which {axis} level is the knee: the first whose p99 E2E exceeds {factor:g}x the lightest level's? "
             "Pick from {levels}.", ("axis", "levels", "p99_by_level", "factor"), _knee_level, _same_level,
             "Divide each level's p99 E2E by the lightest level's; the knee is the first ratio above the factor.",
             "below the knee extra load finds idle batch slots; from there on, it waits in the queue",
             _level_detail),
    Exercise("tail_or_mean", "08_p99_and_load",
             "Between the two configurations, which moved more in relative terms: the 'mean' or the 'p99'?",
             ("mean_a", "mean_b", "p99_a", "p99_b"),
             lambda c: "mean" if abs(math.log(c["mean_b"] / c["mean_a"])) > abs(math.log(c["p99_b"] / c["p99_a"]))
             else "p99", same_choice, "Compute both ratios b/a.",
             "mean and tail respond to different causes; watch both"),
    Exercise("tail_cause", "09_case_study",
             "Which span holds most of the p99 request's time: {spans}?", ("spans", "p99_span_s"),
             lambda c: max(c["spans"], key=lambda s: c["p99_span_s"][s]), same_choice,
             "Read the span breakdown of the slowest requests, not of the average one.",
             "the span that grows in the tail is where the fix goes"),
    Exercise("locked_capacity", "09_case_study",
             "The shipped stage holds one lock for each request's store call, {hold_ms:.0f} ms, and nothing else "
             "ever runs under it. Whatever the cores, what is the highest rate (requests/s) the shipped service "
             "can sustain?", ("hold_ms", "rate"),
             lambda c: 1e3 / c["hold_ms"], within_factor(1.5),
             "Requests pass the lock one at a time; each keeps it for the hold time.",
             "a lock is a single server: its capacity is 1 / hold time, whatever the cores",
             lambda a, c: f"at the operating rate {c['rate']:.1f} req/s the lock is busy "
                          f"{100 * c['rate'] * c['hold_ms'] / 1e3:.0f}% of the time"),
    Exercise("queue_bound", "09_case_study",
             "The fixed service completes {capacity:.1f} requests/s at most; the SLO is {slo_ms:.0f} ms and a request "
             "alone takes {normal_ms:.0f} ms. By Little's law, how many requests may wait before it should answer "
             "429?", ("capacity", "slo_ms", "normal_ms"),
             lambda c: max(1, int(c["capacity"] * max(0.0, c["slo_ms"] - c["normal_ms"]) / 1e3)),
             lambda a, ref, c: abs(int(a) - ref) <= 1 or within_factor(1.5)(a, ref, c),
             "Waiting requests drain at the capacity rate; the last one may wait at most SLO - normal latency.",
             "bound = capacity x (SLO - normal latency): the queue the server can drain within the SLO"),
]}

_CONTEXT: dict[str, dict[str, Any]] = {}
# Set (to anything) by the notebook tests: an unanswered check then also judges the reference answer
# against this run's measurements and raises if it fails.
SELFTEST_ENV = "LABKIT_EXERCISE_SELFTEST"


def exercise(name: str) -> Exercise:
    if name not in EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; known: {', '.join(EXERCISES)}")
    return EXERCISES[name]


def ask(name: str, **ctx: Any) -> None:
    """Store this run's measurements for exercise `name` and print its question."""
    e = exercise(name)
    missing = [k for k in e.needs if k not in ctx]
    if missing:
        raise ValueError(f"exercise {name!r} needs {missing} (it needs {list(e.needs)})")
    ctx = dict(ctx)
    if callable(ctx.get("evaluate")):  # a simulation per call: run each setting once
        ctx["evaluate"] = functools.lru_cache(maxsize=None)(ctx["evaluate"])
    _CONTEXT[name] = ctx
    print("Your turn:", e.question.format(**ctx))


def _ctx(name: str) -> dict[str, Any]:
    if name not in _CONTEXT:
        raise ValueError(f"exercise {name!r} has no measurements yet: run its `exercise.ask(...)` cell first")
    return _CONTEXT[name]


def solution(name: str) -> Any:
    """The reference answer from this run's measurements (for hosts)."""
    return exercise(name).solve(_ctx(name))


def check(name: str, answer: Any) -> bool | None:
    """Judge `answer`; prints a hint on a miss and why on a hit. None = not answered yet."""
    e, ctx = exercise(name), _ctx(name)
    if answer is None:
        if os.environ.get(SELFTEST_ENV):  # the test suite's notebook runs: the reference must pass here
            try:
                ref = e.solve(ctx)
            except ValueError as err:  # this run has no reference answer (e.g. a sweep without a knee)
                print(f"[{name}] selftest: no reference answer on this run ({err})")
            else:
                if not e.judge(ref, ref, ctx):
                    raise AssertionError(f"[{name}] the reference answer {ref!r} fails its own check on this run")
        print(f"[{name}] no answer yet: write yours in the cell above and run both again. Hint: {e.hint}")
        return None
    try:
        right = bool(e.judge(answer, e.solve(ctx), ctx))
    except (TypeError, ValueError) as err:
        print(f"[{name}] could not read {answer!r} as an answer ({err}). Hint: {e.hint}")
        return False
    print(f"[{name}] {'right' if right else 'not quite'}: " + (e.why if right else e.hint))
    if e.detail is not None:
        print(f"[{name}] {e.detail(answer, ctx)}")
    return right
