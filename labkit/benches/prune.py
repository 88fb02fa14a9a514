"""``python -m labkit.benches.prune [--size smoke|full]``: C12's acceptance figures in one run.

1. one 4096 x 4096 fp32 matmul at batch 1: dense vs unstructured-kept-dense, CSR, COO and
   structured (smaller dense) at 50% and 75%;
2. the CSR break-even sparsity sweep;
3. decode steps of the random-init ``small`` preset (~400 MB of weights, memory-bound):
   dense, unstructured kept dense, CSR, structured at 50% and 75%;
4. accuracy of each on the trained tiny checkpoint, before and after a recovery fine-tune;
5. 2:4 semi-structured vs dense on a large GEMM (CUDA, compute capability >= 8.0), or
   one line saying why it is skipped.

Sizes come from ``labkit.presets.SIZES["pruning"]`` (``--size smoke``: the smoke sizes).
"""

from __future__ import annotations

import sys

import torch

from labkit.benches import kit
from labkit.data import corpus_ids
from labkit.ledger.ch4 import c12_speedups, judge_c12, predict_c12
from labkit.model import Transformer, load_tiny
from labkit.prune import experiments as px
from labkit.prune.recover import RecoveryBudget
from labkit.prune.semistructured import gemm_24_speed, semi_structured_support
from labkit.report import format_rows


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


def parser():
    """The shared bench flags (--device picks where the 2:4 GEMM of section 5 runs) plus
    --gemm24-only."""
    ap = kit.parser("labkit.benches.prune", __doc__, devices=("cpu", "cuda"),
                         quick_help="smoke sizes (seconds, not minutes)")
    ap.add_argument("--gemm24-only", action="store_true", help="only section 5, the 2:4 GEMM (for GPU checks)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with kit.session(args) as run:
        if args.gemm24_only:
            gemm24()
            run.summary = "2:4 GEMM section only"
        else:
            body(run, args.size, args.threads)
    return run.rc


def body(run: kit.BenchRun, size: str, threads: int | None) -> None:
    """Sections 1-5; figures go into `run` and its summary."""
    P = px.bench_sizes(size, threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, sizes {size}")

    n = P["matmul_n"]
    print(f"\n== 1. one {n}x{n} fp32 weight x a batch-1 input ({4 * n * n / 2**20:.0f} MiB dense) ==")
    print(format_rows(run.record("matmul", px.matmul_rows(n, P["sparsities"], repeat=P["repeat"], rounds=P["rounds"]))))

    print("\n== 2. CSR vs dense over sparsity: where does CSR start to win? ==")
    sweep = run.record("breakeven", px.breakeven_sweep(n, P["sweep"], repeat=P["repeat"], rounds=P["rounds"]))
    print(format_rows(sweep["rows"]))
    be = sweep["breakeven"]
    print(f"  break-even: {'never within the sweep' if be is None else f'{100 * be:.0f}% sparsity'} "
          f"(bytes alone predict {100 * sweep['bytes_breakeven']:.0f}%)")

    over = P["speed_overrides"]
    print(f"\n== 3. decode on a memory-bound model: {P['speed_preset']} {over or '(all layers)'}, random init ==")
    cfg = Transformer.from_preset(P["speed_preset"], **over).config
    preds = {s: predict_c12(cfg, s) for s in P["sparsities"]}  # before any timing, as the ledger does
    dec = run.record("decode", px.decode_rows(P["speed_preset"], over, P["sparsities"], repeat=P["repeat"],
                                              rounds=P["rounds"]))
    print(format_rows(dec))
    verdicts = {s: judge_c12(preds[s], *c12_speedups(dec, s)) for s in P["sparsities"]}
    run.record("c12_verdicts", {str(s): v.as_dict() for s, v in verdicts.items()})
    for s, v in verdicts.items():
        print(f"  {100 * s:.0f}%: " + str(v).replace("\n", "\n  "))
    structured = c12_speedups(dec, P["sparsities"][0])[2]

    print("\n== 4. accuracy on the trained tiny checkpoint (before / after recovery) ==")
    valid = corpus_ids("valid")
    train = corpus_ids("train", max_chars=P["train_chars"])
    budget = RecoveryBudget(**P["recovery"])
    print(f"  recovery budget per variant: {budget}; perplexity on {P['ppl_windows']} x 256 validation tokens")
    tiny = load_tiny()
    acc = run.record("accuracy", px.accuracy_rows(tiny, valid, train, P["sparsities"], budget, P["ppl_windows"],
                                                  P["calib_windows"]))
    print(format_rows(acc))
    diff = px.csr_matches_dense(tiny, 0.5, valid[:256][None])
    print(f"  CSR vs kept-dense logits, 50%: max |diff| {diff:.1e} (same values, so the same accuracy)")

    gemm24()
    first = P["sparsities"][0]
    run.summary = (f"C12 at {100 * first:.0f}% {verdicts[first].outcome}: structured {structured:.2f}x decode; "
                   f"CSR break-even {'none' if be is None else f'{100 * be:.0f}%'}")


if __name__ == "__main__":
    sys.exit(main())
