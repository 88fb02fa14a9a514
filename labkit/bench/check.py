"""Is labkit measuring right? Compare it, in one run, with the plainest references.

    python -m labkit.bench.check        (or: labkit bench --check)

**Triad.** The reference is plain numpy ``a = b + s*c`` on float64 arrays whose
working set is >= 4 x the last-level cache (a DRAM measurement). Comparing it with
labkit's triad (``torch.add(b, c, alpha=s, out=a)``) naively would be unfair twice over:

* *threads* - numpy's elementwise ops are single-threaded, torch uses every core. So
  labkit's triad is run here with ``torch.set_num_threads(1)`` (its all-threads figure
  is printed too, for information).
* *passes and bytes* - numpy evaluates ``b + s*c`` in two passes (``t = s*c``, then
  ``a = b + t``); labkit's triad is one fused pass. The STREAM convention counts 3
  arrays x 8 bytes per element for both, which credits numpy with traffic it did not
  have to move... and charges it none of what it did. Counting what each actually moves
  on a CPU with write-allocate caches (a store to a line not in cache first reads it):
  labkit: read b, read c, write a (+1 write-allocate read) = 4 x 8 B per element;
  numpy: pass 1 reads c and writes a (+1 write-allocate), pass 2 reads b and a and
  writes a (a's lines were just read, so no extra read) = 6 x 8 B per element.
  The ratio of these *traffic* bandwidths is the like-for-like comparison; both the
  STREAM-convention and traffic figures are printed.

numpy runs with ``out=`` (the same expression, into the same preallocated array):
the literal ``a = b + s*c`` allocates a fresh 40+ MiB result every call, and page
faults on it would be timed as bandwidth. Its rate is printed as well. All three are
timed with `labkit.timing.measure` in interleaved rounds on the same arrays, so a
noisy neighbour slows them alike; rates use the median.

**Matmul.** labkit's fp32 GEMM (its `run_kernel`) against a plain ``torch.matmul(a, b)``
loop, on the same large sizes, each side's best size by median.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from labkit import timing
from labkit.bench import zoo
from labkit.bench.core import last_level_cache_bytes, run_kernel, threads

TRIAD_TARGET = 0.10    # |ratio - 1| within 10%
MATMUL_TARGET = 0.90   # labkit >= 90% of the best torch.matmul rate


def triad(llc_multiple: float = 4.0, rounds: int = 10) -> dict[str, float]:
    """Bandwidths in bytes/s of labkit's triad and numpy's, measured in one interleaved run."""
    cpu = torch.device("cpu")
    n = int(llc_multiple * last_level_cache_bytes(cpu) / (3 * 8))
    rng = np.random.default_rng(0)
    b, c, a = rng.random(n), rng.random(n), np.empty(n)
    s = zoo.SCALAR
    tb, tc, ta = (torch.from_numpy(x) for x in (b, c, a))  # same memory, same pages

    def labkit_triad():
        torch.add(tb, tc, alpha=s, out=ta)

    def numpy_out():
        np.multiply(c, s, out=a)
        np.add(b, a, out=a)

    def numpy_literal():
        return b + s * c

    fns = {"labkit_1t": labkit_triad, "numpy": numpy_out, "numpy_literal": numpy_literal}
    samples: dict[str, list[float]] = {k: [] for k in (*fns, "labkit_all")}
    for _ in range(rounds):
        with threads(1):
            for k, fn in fns.items():
                samples[k] += timing.measure(fn, warmup=1, repeat=3, device=cpu).samples
        samples["labkit_all"] += timing.measure(labkit_triad, warmup=1, repeat=3, device=cpu).samples
    med = {k: timing.percentile(v, 50) for k, v in samples.items()}
    stream_bytes = 3 * 8 * n
    traffic = {"labkit_1t": 4, "labkit_all": 4, "numpy": 6, "numpy_literal": 6}
    out = {"n": n, "working_set_bytes": stream_bytes, "llc_bytes": last_level_cache_bytes(cpu)}
    for k, t in med.items():
        out[f"{k}_s"] = t
        out[f"{k}_stream_Bps"] = stream_bytes / t
        out[f"{k}_traffic_Bps"] = traffic[k] * 8 * n / t
    out["ratio"] = out["labkit_1t_traffic_Bps"] / out["numpy_traffic_Bps"]
    return out


def matmul(sizes: tuple[int, ...] = (1024, 2048), rounds: int = 5) -> dict[str, float]:
    """Best fp32 GEMM FLOP/s of labkit vs plain torch.matmul, over the same large sizes.

    Both sides use the same statistic: the median of their repeats per size, best size
    wins (an n = 1024 GEMM can beat n = 2048 when its operands fit in the last-level
    cache, so comparing one fixed labkit size with the reference's best size would
    compare two different things). The reference is a bare ``torch.matmul(a, b)`` loop
    timed with perf_counter. Rounds alternate labkit and reference so background load
    hits both.
    """
    lab: dict[int, list[float]] = {m: [] for m in sizes}
    ref: dict[int, list[float]] = {m: [] for m in sizes}
    mats = {m: (torch.randn(m, m), torch.randn(m, m)) for m in sizes}
    for _ in range(rounds):
        for m, (x, y) in mats.items():
            lab[m].append(run_kernel("gemm", dtype="fp32", device="cpu", group="check", warmup=1, repeat=3,
                                     m=m, n=m, k=m).flop_per_s)
            torch.matmul(x, y)
            for _ in range(3):
                t0 = time.perf_counter()
                torch.matmul(x, y)
                ref[m].append(2 * m**3 / (time.perf_counter() - t0))
    lab_best = max(sizes, key=lambda m: float(np.median(lab[m])))
    ref_best = max(sizes, key=lambda m: float(np.median(ref[m])))
    labkit, best = float(np.median(lab[lab_best])), float(np.median(ref[ref_best]))
    return {"n": lab_best, "ref_n": ref_best, "labkit_flop_per_s": labkit, "torch_best_flop_per_s": best,
            "ratio": labkit / best}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.bench.check", description=__doc__.split("\n")[0])
    ap.add_argument("--matmul-sizes", type=int, nargs="+", default=[1024, 2048],
                    help="square GEMM sizes n compared (default 1024 2048)")
    args = ap.parse_args(argv)
    t = triad()
    gb = 1e9
    print(f"triad: {t['n'] / 1e6:.1f} M float64 per array, working set {t['working_set_bytes'] / 2**20:.0f} MiB "
          f"= {t['working_set_bytes'] / t['llc_bytes']:.1f} x LLC; median of interleaved calls")
    print(f"  {'':<34}{'time':>10}{'STREAM GB/s':>13}{'traffic GB/s':>14}")
    for k, label in (("labkit_1t", "labkit triad, 1 thread (1 pass)"), ("numpy", "numpy a = b + s*c, out= (2 passes)"),
                     ("numpy_literal", "numpy a = b + s*c, literal"), ("labkit_all", f"labkit triad, {torch.get_num_threads()} threads")):
        print(f"  {label:<34}{timing.fmt_time(t[k + '_s']):>10}{t[k + '_stream_Bps'] / gb:>13.2f}"
              f"{t[k + '_traffic_Bps'] / gb:>14.2f}")
    ok_t = abs(t["ratio"] - 1) <= TRIAD_TARGET
    print(f"  labkit / numpy (traffic, same thread count): {t['ratio']:.3f}  "
          f"target within {TRIAD_TARGET:.0%}: {'PASS' if ok_t else 'FAIL'}")
    m = matmul(tuple(args.matmul_sizes))
    ok_m = m["ratio"] >= MATMUL_TARGET
    print(f"matmul fp32: labkit best {m['labkit_flop_per_s'] / gb:.1f} GFLOP/s (n={m['n']}, median) vs best "
          f"torch.matmul {m['torch_best_flop_per_s'] / gb:.1f} GFLOP/s (n={m['ref_n']}): ratio {m['ratio']:.3f}  "
          f"target >= {MATMUL_TARGET:.0%}: {'PASS' if ok_m else 'FAIL'}")
    return 0 if ok_t and ok_m else 1


if __name__ == "__main__":
    sys.exit(main())
