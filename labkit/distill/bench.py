"""``python -m labkit.distill.bench [--quick]``: C13 and C14's acceptance figures in one run.

1. the same student (the tiny teacher with half its layers) trained from scratch and
   distilled from the tiny checkpoint on the same token budget: validation perplexity;
2. cost accounting: teacher forwards + student training vs from scratch, in measured
   seconds and analytic FLOPs (and the teacher's own pre-training, for scale);
3. the order experiment: distill → prune → quantize vs prune → distill → quantize vs
   quantize first, perplexity after every step, size and decode speed at the end;
4. decode speed-ups over the fp32 teacher: quantization vs a smaller model.

Sizes come from ``labkit.presets.SIZES["pruning"]`` (``--quick``: the smoke sizes).
"""

from __future__ import annotations

import argparse
import time

import torch

from labkit import presets
from labkit.distill import experiments as dx
from labkit.distill.order import run_order, summary
from labkit.model import load_tiny
from labkit.prune import experiments as px
from labkit.quant import quantize_model
from labkit.quant.experiments import corpus_ids, format_rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke sizes (seconds, not minutes)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: the preset's)")
    args = ap.parse_args(argv)
    P = presets.sizes("pruning", "smoke" if args.quick else "full")
    px.use_threads(args.threads or P["threads"])
    t0 = time.perf_counter()
    torch.manual_seed(0)
    budget = dx.budget_from_params(P)
    valid, train = corpus_ids("valid"), corpus_ids("train", max_chars=P["train_chars"])
    tiny = load_tiny()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; perplexity on {P['ppl_windows']} x 256 "
          f"validation tokens; student {budget.student_overrides}, {dx.budget_str(budget.distill)}, {budget.kd}; "
          f"recovery {budget.recovery}")

    print("\n== 1. distilled vs from-scratch student, same init, data and token budget ==")
    cmp = dx.distill_vs_scratch(tiny, train, valid, budget.distill, budget.student_overrides, budget.kd,
                                P["ppl_windows"])
    print(format_rows(cmp["rows"]))

    print("\n== 2. C14 cost: teacher forwards + student training vs from scratch ==")
    print(format_rows(cmp["cost"]))
    pre = dx.teacher_pretraining()
    if pre:
        print(f"  teacher's own pre-training (data/tiny/config.json): {pre['tokens']:,} tokens, {pre['total_s']:.0f} s, "
              f"{pre['total_TFLOP']:.1f} TFLOP")

    print("\n== 3. C13: order of distill (D), prune + recover (P), quantize int8 (Q) ==")
    steps, finals = [], {}
    for order in P["orders"]:
        done = {"D": (cmp["students"]["distilled"], cmp["cost"][1]["total_s"])} if order.startswith("D") else None
        rows, final = run_order(tiny, order, train, valid, budget, done=done)
        steps, finals[rows[0]["order"]] = steps + rows, final
    print(format_rows(steps))
    orders = summary(steps, dx.decode_speeds(finals, repeat=max(10, P["repeat"]), rounds=P["rounds"]))
    print(format_rows(orders))
    v13 = dx.c13_verdict(orders, steps)
    print(f"  winner {v13['winner']} ({v13['winner_ppl']:.2f}); {v13['claimed']} {v13['claimed_ppl']:.2f} "
          f"({v13['gap_pct']:+.1f}%) -> C13 {'holds' if v13['holds'] else 'does not hold here'}; prune step raised "
          "perplexity " + ", ".join(f"x{j:.2f} in {o}" for o, j in v13["prune_jump"].items()))

    print("\n== 4. decode speed vs quality of every variant (tiny teacher, batch 1) ==")
    variants = dx.pareto_variants(tiny, [], cmp["students"], finals)
    variants["teacher int8 + fp32 head"] = ("quantization", quantize_model(tiny, "int8", keep=["output"]))
    sq = dx.speed_quality(variants, valid, P["ppl_windows"], repeat=max(10, P["repeat"]), rounds=P["rounds"])
    print(format_rows(sq))
    v14 = dx.c14_verdict(cmp["cost"], cmp["rows"], sq)
    print(f"  C14: distillation costs {v14['flops_ratio']:.2f}x the FLOPs and {v14['seconds_ratio']:.2f}x the seconds of "
          f"from-scratch training; distilled ppl {v14['distilled_ppl']:.2f} vs scratch {v14['scratch_ppl']:.2f}; best "
          f"quantization {v14['quant_speedup']:.2f}x, best smaller model {v14['smaller_speedup']:.2f}x, all three combined "
          f"{v14['combined_speedup']:.2f}x decode speed-up")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
