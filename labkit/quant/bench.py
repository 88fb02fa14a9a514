"""``python -m labkit.quant.bench [--quick]``: the chapter's acceptance figures in one run.

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

import argparse
import time

import torch

from labkit.model import load_tiny
from labkit.quant.experiments import (WEIGHT_SCHEMES, c10_decode, c10_verdict, corpus_ids, format_rows, kv_table,
                                      mixed_precision, sensitivity_scan, w8a8_table, weight_table)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer perplexity windows and repeats")
    args = ap.parse_args(argv)
    windows = 4 if args.quick else 16
    t0 = time.perf_counter()
    torch.manual_seed(0)
    valid = corpus_ids("valid")
    train = corpus_ids("train", max_chars=300_000)  # calibration: train split, disjoint from valid
    tiny = load_tiny()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; perplexity on {windows} windows x 256 "
          f"validation tokens (bf16/fp16 on fewer: emulated on this CPU and slow)")

    print("\n== 1. weight-only schemes on the trained tiny checkpoint ==")
    names = [n for n in WEIGHT_SCHEMES if n != "fp16"]
    rows = weight_table(tiny, valid, names, windows, ppl_windows={"bf16": max(1, windows // 4)})
    print(format_rows(rows))
    int8 = next(r for r in rows if r["scheme"] == "int8 (int8pack_mm)")
    print(f"  int8 weight-only perplexity {int8['dppl_pct']:+.2f}% vs fp32 (target <= +1%): "
          f"{'met' if int8['dppl_pct'] <= 1 else 'NOT met'}")

    print("\n== 2. C10: decode on a memory-bound preset (small, 2 layers, random init) ==")
    c10 = c10_decode("small", {"n_layers": 2}, batches=(1, 8), repeat=5 if args.quick else 20)
    print(format_rows(c10))
    by = {r["scheme"]: r for r in c10}
    v = c10_verdict(c10, batch=1)
    print(f"  batch 1: best int8 path {v['best_int8']}: {v['measured_speedup']:.2f}x vs fp32, bytes predict "
          f"{v['predicted_speedup']:.2f}x ({100 * v['share_of_prediction']:.0f}% of the prediction)")
    print(f"  bytes: int8/fp32 = {by['int8 (int8pack_mm)']['read_MB_per_step'] / by['fp32']['read_MB_per_step']:.3f}"
          f" (a quarter, not a half); int8/fp16 = "
          f"{by['int8 (int8pack_mm)']['read_MB_per_step'] / by['fp16']['read_MB_per_step']:.3f} (a half)")

    print("\n== 3. W8A8: calibration, outliers, repairs (simulated: fake-quant, fp32 matmul) ==")
    print(format_rows(w8a8_table(tiny, train, valid, windows)))

    print("\n== 4. mixed precision: one layer at a time in int4-g128, then keep the k most sensitive in fp32 ==")
    scan = sensitivity_scan(tiny, valid, "int4-g128", windows)
    print(format_rows(scan[:5]))
    print(format_rows(mixed_precision(tiny, valid, scan, "int4-g128", windows, ks=(0, 1, 2, 4))))

    print("\n== 5. KV cache int8 (the decoder's int8 KVCache: allocated bytes, perplexity through the cache, decode tok/s) ==")
    print(format_rows(kv_table(tiny, valid, windows)))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
