"""``python -m labkit.prune.bench [--quick]``: C12's acceptance figures in one run.

1. one 4096 x 4096 fp32 matmul at batch 1: dense vs unstructured-kept-dense, CSR, COO and
   structured (smaller dense) at 50% and 75%;
2. the CSR break-even sparsity sweep;
3. decode steps of the random-init ``small`` preset (~400 MB of weights, memory-bound):
   dense, unstructured kept dense, CSR, structured at 50% and 75%;
4. accuracy of each on the trained tiny checkpoint, before and after a recovery fine-tune;
5. 2:4 semi-structured vs dense on a large GEMM (CUDA, compute capability >= 8.0), or
   one line saying why it is skipped.

Sizes come from ``labkit.presets.SIZES["pruning"]`` (``--quick``: the smoke sizes).
"""

from __future__ import annotations

import argparse
import time

import torch

from labkit import presets
from labkit.model import load_tiny
from labkit.prune import experiments as px
from labkit.prune.recover import RecoveryBudget
from labkit.prune.semistructured import gemm_24_speed, semi_structured_support
from labkit.quant.experiments import corpus_ids, format_rows


def gemm24() -> None:
    """Section 5: 2:4 vs dense fp16 on a skinny (decode-like) and a large square GEMM on the
    first CUDA device, or one line saying why it is skipped."""
    print("\n== 5. 2:4 semi-structured GEMM ==")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ok, why = semi_structured_support(dev)
    if not ok:
        print(f"  skipped: {why}")
        return
    print(f"  {why}")
    print(format_rows([gemm_24_speed(8192, m, device=dev) for m in (64, 8192)]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke sizes (seconds, not minutes)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: the preset's)")
    ap.add_argument("--gemm24-only", action="store_true", help="only section 5, the 2:4 GEMM (for GPU checks)")
    args = ap.parse_args(argv)
    if args.gemm24_only:
        return gemm24()
    P = presets.sizes("pruning", "smoke" if args.quick else "full")
    px.use_threads(args.threads or P["threads"])
    t0 = time.perf_counter()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, sizes {'smoke' if args.quick else 'full'}")

    n = P["matmul_n"]
    print(f"\n== 1. one {n}x{n} fp32 weight x a batch-1 input ({4 * n * n / 2**20:.0f} MiB dense) ==")
    print(format_rows(px.matmul_rows(n, P["sparsities"], repeat=P["repeat"], rounds=P["rounds"])))

    print("\n== 2. CSR vs dense over sparsity: where does CSR start to win? ==")
    sweep = px.breakeven_sweep(n, P["sweep"], repeat=P["repeat"], rounds=P["rounds"])
    print(format_rows(sweep["rows"]))
    be = sweep["breakeven"]
    print(f"  break-even: {'never within the sweep' if be is None else f'{100 * be:.0f}% sparsity'} "
          f"(bytes alone predict {100 * sweep['bytes_breakeven']:.0f}%)")

    over = P["speed_overrides"]
    print(f"\n== 3. decode on a memory-bound model: {P['speed_preset']} {over or '(all layers)'}, random init ==")
    dec = px.decode_rows(P["speed_preset"], over, P["sparsities"], repeat=P["repeat"], rounds=P["rounds"])
    print(format_rows(dec))
    for s in P["sparsities"]:
        print("  " + px.c12_sentence(px.c12_verdict(dec, s)))
    v50 = px.c12_verdict(dec, 0.5)
    print(f"  structured 50% decode speed-up {v50['structured']:.2f}x (target >= 1.5x on a memory-bound preset): "
          f"{'met' if v50['structured'] >= 1.5 else 'NOT met'}")

    print("\n== 4. accuracy on the trained tiny checkpoint (before / after recovery) ==")
    valid = corpus_ids("valid")
    train = corpus_ids("train", max_chars=P["train_chars"])
    budget = RecoveryBudget(**P["recovery"])
    print(f"  recovery budget per variant: {budget}; perplexity on {P['ppl_windows']} x 256 validation tokens")
    tiny = load_tiny()
    acc = px.accuracy_rows(tiny, valid, train, P["sparsities"], budget, P["ppl_windows"], P["calib_windows"])
    print(format_rows(acc))
    diff = px.csr_matches_dense(tiny, 0.5, valid[:256][None])
    print(f"  CSR vs kept-dense logits, 50%: max |diff| {diff:.1e} (same values, so the same accuracy)")

    gemm24()
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
