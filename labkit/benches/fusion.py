"""Chapter 3's acceptance figures in one run: ``python -m labkit.benches.fusion [--size smoke|full] [--device auto]``.

Sections (each a function of `labkit.fusion.experiments` the notebook also calls): C6 tiny-op overhead share;
C7 fused elementwise chains (speed-up, bytes/s vs measured bandwidth, kernel counts,
graph nodes) and the decoder's decode step eager vs compiled (vs CUDA graphs on a
GPU); C8 Conv+BN folding; C9 peak memory per autograd mode and fresh vs reused buffers.
Unlike the notebook's smoke size, the bench always reports the acceptance set: chains
of at least 16 M elements, the decode step compiled at every batch size, and the full
`small` preset (all layers) for peak memory.
"""

from __future__ import annotations

import sys

import torch

from labkit import presets
from labkit.benches import kit
from labkit.fusion import elementwise, fold, memory
from labkit.fusion.experiments import chains, decode_steps, forward_memory, tiny_ops_share

MIN_BENCH_NUMEL = 16 * 2**20


def parser():
    """The shared bench flags (--size smoke|full) plus --chain-numel."""
    ap = kit.parser("labkit.benches.fusion", __doc__, devices=("cpu", "cuda", "mps"),
                         quick_help="the notebook's smoke sizes (default: full)")
    ap.add_argument("--chain-numel", type=kit.positive_int, default=None,
                    help=f"elements per elementwise chain (default: the preset's, at least {MIN_BENCH_NUMEL})")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    with kit.session(a) as run:
        body(run, a.size, run.device, a.chain_numel)
    return run.rc


def body(run: kit.BenchRun, size: str, dev: torch.device, chain_numel: int | None) -> None:
    """C6-C9; figures go into `run` and its summary."""
    p = presets.sizes("fusion", size, dev)
    numel = chain_numel or max(p["chain_numel"], MIN_BENCH_NUMEL)
    p.update(compile_batches=p["decode_batches"], mem_overrides={}, mem_seq=max(p["mem_seq"], 256))
    print(f"labkit.fusion bench: SIZE={size} DEVICE={dev} threads={torch.get_num_threads()}")

    s = run.record("c6_tiny_ops", tiny_ops_share(p["tiny_ops"], dev))
    print(f"\n[C6] TinyOps: {s['ops']} ops in {s['measured_s'] * 1e3:.2f} ms; per-op overhead "
          f"{s['per_op_s'] * 1e6:.2f} µs -> predicted {s['predicted_s'] * 1e3:.2f} ms = {s['share']:.0%} of measured")

    c = run.record("c7_chains", chains(numel, dev, p["chain_repeat"], p["triton_numel"]))
    speedups = []
    bw = c["bandwidth"]
    print(f"\n[C7] elementwise chains, {numel / 2**20:.0f} M fp32 elements; measured bandwidth read "
          f"{bw['read'] / 1e9:.1f} GB/s, copy {bw['copy'] / 1e9:.1f} GB/s; Triton: {c['triton']}")
    for chain in elementwise.CHAINS:
        rows = {r.version: r for r in c[chain]["rows"]}
        g = c[chain]["graph_nodes"]
        for r in rows.values():
            print(f"  {chain:18s} {r.version:8s} {r.time_s * 1e3:8.2f} ms  {r.bytes / 2**20:6.0f} MiB modelled "
                  f"{r.bytes_per_s / 1e9:6.2f} GB/s ({r.bytes_per_s / bw['read']:.0%} of read bw)  "
                  f"{r.kernels} kernels  max|err| {r.max_error:.1e}")
        e, k = rows["eager"], rows["compiled"]
        speedups.append(e.time_s / k.time_s)
        print(f"  {chain}: compiled speed-up {e.time_s / k.time_s:.2f}x; kernels {e.kernels} -> {k.kernels} "
              f"({e.kernels / max(k.kernels, 1):.1f}x fewer); ATen graph nodes {g.aten_nodes} -> {g.kernels} kernel(s)"
              + (f"; Triton max|err| {c[chain]['triton_error']:.1e}" if "triton_error" in c[chain] else ""))

    f = run.record("c8_fold", fold.time_conv_block(batch=p["conv_batch"], channels=p["conv_channels"], hw=p["conv_hw"]))
    print(f"\n[C8] Conv+BN+ReLU ({p['conv_batch']}x{p['conv_channels']}x{p['conv_hw']}²): max|err| "
          f"{f['max_error']:.1e}; {f['unfolded_s'] * 1e3:.2f} ms ({f['unfolded_kernels']} kernels) -> folded "
          f"{f['folded_s'] * 1e3:.2f} ms ({f['folded_kernels']} kernels)")

    print(f"\n[C6/C7] decode step, {p['decode_model']} preset, context {p['decode_context']}, "
          f"torch threads {p['decode_threads'] if dev.type == 'cpu' else 'default'}:")
    rows = run.record("decode", decode_steps(p, dev))
    eager = {r.batch: r for r in rows if r.variant == "eager"}
    for r in rows:
        base = eager.get(r.batch)
        ratio = (f"  {base.step_s / r.step_s:.2f}x vs eager (fastest repeats: {base.best_s / r.best_s:.2f}x)"
                 if base and r.variant != "eager" else "")
        nodes = f", {r.graph_nodes} ATen graph nodes, first call {r.first_call_s:.1f} s" if r.graph_nodes else ""
        print(f"  {r.variant:10s} batch {r.batch}: {r.step_s * 1e3:7.2f} ms/step (best {r.best_s * 1e3:.2f}), {r.ops} ops, "
              f"{r.kernels} kernels{nodes}{ratio}")

    m = run.record("c9_memory", forward_memory(p, dev))
    print(f"\n[C9] peak memory, one forward of {p['mem_model']}{' ' + str(p['mem_overrides']) if p['mem_overrides'] else ''} at batch {m.batch} x "
          f"{m.seq} tokens ({m.method}): " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in m.peaks.items())
          + f"; train / inference_mode = {m.ratio:.1f}x")
    if dev.type == "cpu":
        r = run.record("fresh_vs_reused", memory.fresh_vs_reused(p["reuse_numel"]))
        print(f"  a+b on {r.numel / 2**20:.0f} M fp32: fresh output {r.fresh_s * 1e3:.1f} ms "
              f"({r.fresh_faults:.0f} page faults), preallocated out= {r.reused_s * 1e3:.1f} ms "
              f"({r.reused_faults:.0f}), in place {r.inplace_s * 1e3:.1f} ms: {r.speedup:.1f}x; "
              f"~{r.us_per_fault:.1f} µs per fault")
    run.summary = (f"C6 overhead {s['share']:.0%} of TinyOps; C7 compiled chains {min(speedups):.2f}-"
                   f"{max(speedups):.2f}x; C8 folded {f['unfolded_s'] / f['folded_s']:.2f}x; "
                   f"C9 train/inference_mode memory {m.ratio:.1f}x")


if __name__ == "__main__":
    sys.exit(main())
