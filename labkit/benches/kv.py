"""KV-cache memory on the real engine: paged vs max-length reservation, block size, int8; and the
paged cache's ragged reads vs padded ones on decode batches of mixed lengths.

    python -m labkit.benches.kv [--size smoke|full]

The runs and their definitions (waste, max concurrency) are `labkit.serve.kv_capacity`'s;
this program serves notebook 07's mix of request lengths at its sizes and prints every figure.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from labkit import presets
from labkit.benches import kit
from labkit.data import corpus_ids
from labkit.model import load_tiny, perplexity
from labkit.model.kv_memory import kv_bytes_per_token
from labkit.serve.kv_capacity import decode_speed, format_runs, mixed_workload, ragged_decode, run


def parser() -> argparse.ArgumentParser:
    """The shared bench flags (CPU; 1 torch thread by default: these models are too small
    to gain from more)."""
    return kit.parser("labkit.benches.kv", __doc__, default_threads=1,
                           quick_help="notebook 07's smoke sizes (default: its full sizes)",
                           formatter_class=argparse.RawDescriptionHelpFormatter)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with kit.session(args) as session:
        session.results = body(args.size)
        r = session.results
        session.summary = (f"paged/max-length concurrency {r['paged_gain']:.1f}x; int8 KV concurrency "
                           f"{r['int8_gain']:.2f}x, perplexity {r['int8_dppl_pct']:+.2f}%; decode step padded/ragged "
                           + ", ".join(f"{v['padded_s'] / v['ragged_s']:.2f}x" for v in r["ragged_decode"].values()))
    return session.rc


def ragged_batches(max_len: int) -> list[tuple[str, list[int]]]:
    """Decode batches whose rows hold different contexts (tokens): one long row among short ones,
    and a spread of lengths; plus equal rows, where ragged reads have nothing to save."""
    top = max_len - 2
    return [(f"1 x {top} + 15 x 32 tokens", [top] + [32] * 15),
            ("16 rows spread over 16.." + str(top), np.linspace(16, top, 16).astype(int).tolist()),
            (f"16 x {top} tokens", [top] * 16)]


def body(size: str) -> dict:
    """Paged vs max-length reservation, block sizes, int8 KV; returns every figure."""
    P = presets.sizes("kv_cache", size)  # the sizes notebook 07 uses
    torch.manual_seed(0)
    model = load_tiny()
    wl = mixed_workload(P["engine_requests"], P["prompt_median"], P["output_median"], P["engine_max_len"])
    budget = P["engine_budget_tokens"] * kv_bytes_per_token(model.config, model.dtype)
    print(f"tiny decoder ({model.dtype}), {len(wl.prompt)} requests, prompt median {int(np.median(wl.prompt))} / output "
          f"median {int(np.median(wl.output))} tokens, max_model_len {wl.max_len}; KV budget {budget / 2**20:.1f} MiB")
    rows = [run(model, wl, budget, kv_reserve="max_len")]
    rows += [run(model, wl, budget, block_size=b) for b in sorted({16, *P["block_sizes"]})]
    print(format_runs(rows))
    contig, paged = rows[0], next(r for r in rows[1:] if r["block_size"] == 16)
    print(f"paged (16-token blocks) vs max-length reservation: waste {paged['waste']:.1%} vs {contig['waste']:.1%}, "
          f"max concurrency {paged['peak_running']} vs {contig['peak_running']} "
          f"({paged['peak_running'] / contig['peak_running']:.1f}x)")
    wl8 = mixed_workload(P["int8_requests"], P["prompt_median"], P["output_median"], P["engine_max_len"])
    base, int8 = (run(model, wl8, budget, kv_dtype=kind) for kind in ("model", "int8"))
    print(format_runs([base, int8]))
    valid = corpus_ids("valid")
    ppl = {k: perplexity(model, valid, max_windows=P["ppl_windows"], kv_dtype=k) for k in ("model", "int8")}
    speed = {k: decode_speed(model, k, batch=P["speed_batch"], prompt=P["speed_tokens"], output=P["speed_tokens"],
                             repeat=P["speed_repeat"]) for k in ("model", "int8")}
    gain = int8["peak_running"] / base["peak_running"]
    ragged = {name: ragged_decode(model, ctx, rounds=P["speed_repeat"]) for name, ctx in ragged_batches(P["engine_max_len"])}
    for name, r in ragged.items():
        print(f"decode step, {name}: ragged reads {1e3 * r['ragged_s']:.2f} ms ({r['groups']} groups) vs padded "
              f"{1e3 * r['padded_s']:.2f} ms: {r['padded_s'] / r['ragged_s']:.2f}x")
    print(f"int8 KV ({len(wl8.prompt)} requests): {int8['bytes_per_token']} vs {base['bytes_per_token']} bytes/token, "
          f"max concurrency {int8['peak_running']} vs {base['peak_running']} ({gain:.2f}x) at the same budget; "
          f"perplexity {ppl['model']:.3f} -> {ppl['int8']:.3f} ({100 * (ppl['int8'] / ppl['model'] - 1):+.2f}%); "
          f"decode {speed['model']:.0f} -> {speed['int8']:.0f} tokens/s")
    return {"rows": rows, "int8_rows": [base, int8], "perplexity": ppl, "decode_tok_s": speed,
            "paged_gain": paged["peak_running"] / contig["peak_running"], "int8_gain": gain, "ragged_decode": ragged,
            "int8_dppl_pct": 100 * (ppl["int8"] / ppl["model"] - 1)}


if __name__ == "__main__":
    raise SystemExit(main())
