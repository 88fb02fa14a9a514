"""``python -m labkit.benches.distill [--size smoke|full]``: C13 and C14's acceptance figures in one run.

1. the same student (the tiny teacher with half its layers) trained from scratch and
   distilled from the tiny checkpoint on the same token budget: validation perplexity;
2. cost accounting: teacher forwards + student training vs from scratch, in measured
   seconds and analytic FLOPs (and the teacher's own pre-training, for scale);
3. the order experiment: distill → prune → quantize vs prune → distill → quantize vs
   quantize first, perplexity after every step, size and decode speed at the end;
4. decode speed-ups over the fp32 teacher: quantization vs a smaller model.

Sizes come from ``labkit.presets.SIZES["pruning"]`` (``--size smoke``: the smoke sizes).
"""

from __future__ import annotations

import sys

import torch

from labkit.benches import kit
from labkit.data import corpus_ids
from labkit.ledger.ch4 import judge_c13, judge_c14, order_labels, predict_c13, predict_c14
from labkit.distill import experiments as dx
from labkit.distill.order import run_order, summary
from labkit.model import load_tiny
from labkit.presets import MIN_ROUNDS
from labkit.prune import experiments as px
from labkit.quant import quantize_model
from labkit.report import format_rows


def parser():
    """The shared bench flags (CPU only)."""
    return kit.parser("labkit.benches.distill", __doc__, quick_help="smoke sizes (seconds, not minutes)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with kit.session(args) as run:
        body(run, args.size, args.threads)
    return run.rc


def body(run: kit.BenchRun, size: str, threads: int | None) -> None:
    """Sections 1-4; figures go into `run` and its summary."""
    P = px.bench_sizes(size, threads)
    budget = dx.budget_from_params(P)
    valid, train = corpus_ids("valid"), corpus_ids("train", max_chars=P["train_chars"])
    tiny = load_tiny()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; perplexity on {P['ppl_windows']} x 256 "
          f"validation tokens; student {budget.student_overrides}, {dx.budget_str(budget.distill)}, {budget.kd}; "
          f"recovery {budget.recovery}")

    print("\n== 1. distilled vs from-scratch student, same init, data and token budget ==")
    cmp = dx.distill_vs_scratch(tiny, train, valid, budget.distill, budget.student_overrides, budget.kd,
                                P["ppl_windows"])
    print(format_rows(run.record("distill_vs_scratch", cmp["rows"])))

    print("\n== 2. C14 cost: teacher forwards + student training vs from scratch ==")
    print(format_rows(run.record("cost", cmp["cost"])))
    pre = dx.teacher_pretraining()
    if pre:
        print(f"  teacher's own pre-training (data/tiny/config.json): {pre['tokens']:,} tokens, {pre['total_s']:.0f} s, "
              f"{pre['total_TFLOP']:.1f} TFLOP")

    print("\n== 3. C13: order of distill (D), prune + recover (P), quantize int8 (Q) ==")
    pred13 = predict_c13(order_labels(P["orders"]))
    steps, finals = [], {}
    for order in P["orders"]:
        done = {"D": (cmp["students"]["distilled"], cmp["cost"][1]["total_s"])} if order.startswith("D") else None
        rows, final = run_order(tiny, order, train, valid, budget, done=done)
        steps, finals[rows[0]["order"]] = steps + rows, final
    print(format_rows(steps))
    orders = summary(steps, dx.decode_speeds(finals, repeat=max(10, P["repeat"]), rounds=P["rounds"]))
    print(format_rows(orders))
    run.record("orders", orders)
    v13 = judge_c13(pred13, {r["order"]: r["final_ppl"] for r in orders})
    run.record("c13_verdict", v13.as_dict())
    print("  " + str(v13).replace("\n", "\n  "))
    print("  prune step raised perplexity " + ", ".join(f"x{j:.2f} in {o}" for o, j in dx.prune_jumps(steps).items()))

    print("\n== 4. decode speed vs quality of every variant (tiny teacher, batch 1) ==")
    variants = dx.pareto_variants(tiny, [], cmp["students"], finals)
    variants["teacher int8 + fp32 head"] = ("quantization", quantize_model(tiny, "int8", keep=["output"]))
    sq = dx.speed_quality(variants, valid, P["ppl_windows"], repeat=max(10, P["repeat"]), rounds=P["rounds"])
    print(format_rows(sq))
    run.record("speed_quality", sq)
    student = cmp["students"]["distilled"]
    pred14 = predict_c14(tiny.config, student.config, budget.distill.seq_len)
    runs = {r["run"]: r for r in cmp["cost"]}
    speed, failure = dx.measure_c14_decode(tiny, student, max(10, P["repeat"]), max(MIN_ROUNDS, P["rounds"]),
                                           torch.get_num_threads())
    qf_x = speed["quant+fuse"] / speed["teacher"] if "quant+fuse" in speed else None
    v14 = judge_c14(pred14, runs["from scratch"]["total_s"], runs["distilled"]["total_s"], qf_x,
                    speed["student"] / speed["teacher"], failure)
    run.record("c14_verdict", v14.as_dict())
    print("  " + str(v14).replace("\n", "\n  "))
    run.summary = f"C13 {v13.outcome}: {v13.reason}; C14 {v14.outcome}: {v14.reason}"


if __name__ == "__main__":
    sys.exit(main())
