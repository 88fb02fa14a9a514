"""``python -m labkit.benches.quant [--size smoke|full]``: the chapter's acceptance figures in one run.

1. tiny checkpoint: validation perplexity, model bytes, decode tok/s (batch 1 and 8) and
   kernel path for fp32, bf16, int8 weight-only, int4 g128 / g32 and a mixed scheme;
2. C10 on a memory-bound preset (``small`` with 2 layers, weights >> a 32 MiB LLC):
   bytes per decode step and decode tok/s, fp32 / fp16 / int8 in the same run;
3. W8A8 with minmax / p99.9 / p99.99 / MSE calibration, without and with planted
   outliers, and the repairs;
4. a per-layer sensitivity scan and k-most-sensitive-kept mixed precision;
5. KV-cache int8: bytes per token, sequences that fit, Δ perplexity.
"""

from __future__ import annotations

import sys

import torch

from labkit import presets
from labkit.benches import kit
from labkit.data import corpus_ids
from labkit.ledger.ch4 import judge_c10, predict_c10
from labkit.model import load_tiny
from labkit.quant.experiments import (WEIGHT_SCHEMES, c10_bytes, c10_decode, c10_models,
                                      kv_table, mixed_precision, sensitivity_scan, w8a8_table, weight_table)
from labkit.report import format_rows


def parser():
    """The shared bench flags (CPU only: the int8/int4 kernels here are CPU kernels)."""
    return kit.parser("labkit.benches.quant", __doc__, quick_help="fewer perplexity windows and repeats")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with kit.session(args) as run:
        body(run, presets.sizes("bench_quant", args.size))
    return run.rc


def body(run: kit.BenchRun, P: dict) -> None:
    """The five sections; figures go into `run` and its summary."""
    windows = P["ppl_windows"]
    torch.manual_seed(0)
    valid = corpus_ids("valid")
    train = corpus_ids("train", max_chars=300_000)  # calibration: train split, disjoint from valid
    tiny = load_tiny()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; perplexity on {windows} windows x 256 "
          f"validation tokens (bf16/fp16 on fewer: emulated on this CPU and slow)")

    print("\n== 1. weight-only schemes on the trained tiny checkpoint ==")
    names = [n for n in WEIGHT_SCHEMES if n != "fp16"]
    rows = weight_table(tiny, valid, names, windows, ppl_windows={"bf16": max(1, windows // 4)})
    print(format_rows(run.record("weight_only", rows)))
    int8 = next(r for r in rows if r["scheme"] == "int8 (int8pack_mm)")
    print(f"  int8 weight-only perplexity {int8['dppl_pct']:+.2f}% vs fp32 (target <= +1%): "
          f"{'met' if int8['dppl_pct'] <= 1 else 'NOT met'}")

    print("\n== 2. C10: decode on a memory-bound preset (small, 2 layers, random init) ==")
    models = c10_models("small", {"n_layers": 2})
    pred = predict_c10(c10_bytes(models))  # before any timing, as the ledger does
    c10 = run.record("c10", c10_decode(batches=(1, 8), repeat=P["c10_repeat"], models=models))
    print(format_rows(c10))
    by = {r["scheme"]: r for r in c10}
    v = judge_c10(pred, c10, batch=1)
    run.record("c10_verdict", v.as_dict())
    print("  " + str(v).replace("\n", "\n  "))
    print(f"  bytes: int8/fp32 = {by['int8 (int8pack_mm)']['read_MB_per_step'] / by['fp32']['read_MB_per_step']:.3f}"
          f" (a quarter, not a half); int8/fp16 = "
          f"{by['int8 (int8pack_mm)']['read_MB_per_step'] / by['fp16']['read_MB_per_step']:.3f} (a half)")

    print("\n== 3. W8A8: calibration, outliers, repairs (simulated: fake-quant, fp32 matmul) ==")
    print(format_rows(run.record("w8a8", w8a8_table(tiny, train, valid, windows))))

    print("\n== 4. mixed precision: one layer at a time in int4-g128, then keep the k most sensitive in fp32 ==")
    scan = sensitivity_scan(tiny, valid, "int4-g128", windows)
    print(format_rows(scan[:5]))
    print(format_rows(run.record("mixed", mixed_precision(tiny, valid, scan, "int4-g128", windows, ks=(0, 1, 2, 4)))))

    print("\n== 5. KV cache int8 (the decoder's int8 KVCache: allocated bytes, perplexity through the cache, decode tok/s) ==")
    print(format_rows(run.record("kv_int8", kv_table(tiny, valid, windows))))
    run.summary = (f"int8 weight-only {int8['dppl_pct']:+.2f}% ppl (target <= +1%); C10 {v.outcome}: "
                   f"{v.reason}")


if __name__ == "__main__":
    sys.exit(main())
