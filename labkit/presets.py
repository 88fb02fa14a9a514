"""Problem sizes: the one place that maps SIZE ("smoke" | "full" | "auto") to numbers.

`smoke` keeps every notebook well under two minutes on 2 CPU cores (CI); `full` is
sized to show each effect clearly on a real GPU, and in minutes on a laptop CPU.
`auto` means full on a GPU and smoke on CPU. Chapters add their own entry to
`SIZES`; notebooks read theirs with `sizes(chapter, SIZE, device)`.
"""

from __future__ import annotations

from typing import Any

SIZE_CHOICES = ("smoke", "full", "auto")
# What a program (bench, `labkit ledger`) takes as --size: it runs where it is started, so no "auto".
RUN_SIZES = ("smoke", "full")
# Timed comparisons on a shared machine: at least this many repeats and interleaved rounds
# (best round kept), whatever the preset says; a decode step here is ~5-150 ms. Measured on a
# 2-core machine shared with other jobs, 2 rounds let one variant's best land in a busy spell
# (C10's best int8 path moved between 1.1x and 3.4x); more short rounds give every variant
# its quiet moment.
MIN_REPEAT, MIN_ROUNDS = 5, 5

SIZES: dict[str, dict[str, dict[str, Any]]] = {
    # 00_setup: telemetry trace length, cold/warm timing demo.
    "setup": {
        "smoke": {"telemetry_s": 5.0, "matmul_n": 512, "timing_calls": 30},
        "full": {"telemetry_s": 5.0, "matmul_n": 2048, "timing_calls": 50},
    },
    # 02_roofline / `labkit bench`: memory-bound sizes are (zoo_)llc_multiple x the
    # last-level cache (computed at run time); max_call_s stops a matmul sweep before a slow dtype
    # (emulated bf16 on CPU) takes seconds per call.
    "roofline": {
        "smoke": {"stream_min_bytes": 2**18, "llc_multiple": 4, "stream_points": 7,
                  "matmul_sizes": [64, 128, 256, 512, 1024], "max_call_s": 0.2,
                  "skinny_ms": [1, 4, 16, 64, 256], "skinny_k": 1024, "skinny_n": 4096,
                  "overhead_ops": 500, "zoo_gemm": 1024, "zoo_dim": 4096, "zoo_heads": 8,
                  "zoo_kv_heads": 2, "zoo_head_dim": 64, "zoo_prefill_seq": 512,
                  "zoo_llc_multiple": 2, "zoo_repeat": 3, "c3_gemm": 768, "telemetry_s": 1.5, "decode_batch": 1},
        "full": {"stream_min_bytes": 2**16, "llc_multiple": 8, "stream_points": 14,
                 "matmul_sizes": [64, 128, 256, 512, 1024, 2048, 4096, 8192], "max_call_s": 0.5,
                 "skinny_ms": [1, 2, 4, 8, 16, 32, 64, 128, 256], "skinny_k": 4096, "skinny_n": 4096,
                 "overhead_ops": 2000, "zoo_gemm": 4096, "zoo_dim": 4096, "zoo_heads": 32,
                 "zoo_kv_heads": 8, "zoo_head_dim": 128, "zoo_prefill_seq": 2048,
                 "zoo_llc_multiple": 4, "zoo_repeat": 10, "c3_gemm": 2048, "telemetry_s": 5.0, "decode_batch": 1},
    },
    # 01_prefill_vs_decode: `big_model` (random init, weights >> last-level cache) is
    # timed for prefill/decode; the trained tiny model serves the KV-cache demo and the
    # request path. Each (batch, context) point times `decode_steps` steps, median of `repeat`.
    "prefill_decode": {
        "smoke": {"big_model": "small", "big_overrides": {"n_layers": 4},
                  "prompt_lens": [16, 64, 256], "batches": [1, 8], "contexts": [64, 512],
                  "decode_steps": 4, "repeat": 3, "nocache_prompt": 32, "nocache_tokens": 96,
                  "requests": 3, "max_new_tokens": 24, "n_docs": 4000},
        "full": {"big_model": "1b", "big_overrides": {},
                 "prompt_lens": [16, 64, 256, 1024], "batches": [1, 4, 16, 64],
                 "contexts": [128, 512, 1536], "decode_steps": 16, "repeat": 5,
                 "nocache_prompt": 32, "nocache_tokens": 512, "requests": 8, "max_new_tokens": 64,
                 "n_docs": None},
    },
    # 03_fusion / `python -m labkit.benches.fusion`: TinyOps puzzle, elementwise chains of
    # chain_numel fp32 elements (the bench uses >= 16 M), Conv+BN block, decode step eager
    # vs compiled (compiled only at compile_batches: ~20-45 s each cold on 2 CPU cores;
    # decode_threads=1 on CPU, see DecodeBench.run), peak memory of `mem_model`
    # (+ overrides) at mem_batch x mem_seq, fresh vs reused buffers of reuse_numel.
    "fusion": {
        "smoke": {"tiny_ops": 1000, "chain_numel": 2**22, "chain_repeat": 3, "triton_numel": 64 * 96,
                  "conv_batch": 8, "conv_channels": 32, "conv_hw": 56, "decode_model": "tiny",
                  "decode_context": 32, "decode_batches": [1, 8], "compile_batches": [1], "decode_repeat": 10,
                  "decode_threads": 1,
                  "mem_model": "small", "mem_overrides": {"n_layers": 2}, "mem_batch": 1, "mem_seq": 128,
                  "reuse_numel": 16 * 2**20},
        "full": {"tiny_ops": 1000, "chain_numel": 2**26, "chain_repeat": 10, "triton_numel": 256 * 96,
                 "conv_batch": 32, "conv_channels": 64, "conv_hw": 112, "decode_model": "1b",
                 "decode_context": 128, "decode_batches": [1, 8], "compile_batches": [1, 8], "decode_repeat": 20,
                 "decode_threads": None,
                 "mem_model": "small", "mem_overrides": {}, "mem_batch": 4, "mem_seq": 512,
                 "reuse_numel": 64 * 2**20},
    },
    # 06_batching: requests per simulation, load-sweep points, decoder calibration sweep.
    "batching": {
        "smoke": {"requests": 4000, "queue_requests": 20_000, "sweep_requests": 1500, "sweep_points": 8, "mixed_requests": 1500,
                  "calib_batches": [1, 8], "calib_contexts": [64], "calib_prompts": [32, 128], "calib_repeat": 3},
        "full": {"requests": 100_000, "queue_requests": 200_000, "sweep_requests": 20_000, "sweep_points": 14, "mixed_requests": 20_000,
                 "calib_batches": [1, 4, 16, 64], "calib_contexts": [64, 512], "calib_prompts": [32, 128, 512],
                 "calib_repeat": 10},
    },
    # 04_quantization: perplexity on `ppl_windows` x 256 validation tokens; calibration on
    # `calib_windows` x 256 train tokens; C10 decode on `c10_preset` (+ overrides), weights
    # >> last-level cache so decode is memory-bound; `repeat` timed decode steps per point, best
    # of `rounds` interleaved rounds; planted outliers (`n_outliers` channels x `outlier_factor`);
    # SmoothQuant `alphas`; mixed precision keeps `keep_ks` layers; KV fit in `kv_memory_gb` GB.
    "quantization": {
        "smoke": {"ppl_windows": 4, "calib_windows": 4, "c10_preset": "small", "c10_overrides": {"n_layers": 2},
                  "batches": [1], "repeat": 5, "rounds": 2, "outlier_factor": 100.0, "n_outliers": 4, "alphas": [0.5],
                  "keep_ks": [0, 1, 4], "kv_memory_gb": 16.0},
        "full": {"ppl_windows": 32, "calib_windows": 16, "c10_preset": "small", "c10_overrides": {},
                 "batches": [1, 8], "repeat": 10, "rounds": 3, "outlier_factor": 100.0, "n_outliers": 4, "alphas": [0.5, 0.8],
                 "keep_ks": [0, 1, 2, 4, 8], "kv_memory_gb": 16.0},
    },
    # 05_pruning_distillation: owned by labkit.prune / labkit.distill.
    # C12 speed: one matmul_n x matmul_n fp32 weight (64 MiB at 4096) and decode of `speed_preset`
    # (+ overrides, random init; full `small` is ~400 MB of weights, the smoke one ~110 MB with a small
    # vocabulary so the blocks, not the output head, dominate) at `sparsities`; CSR break-even
    # `sweep`; best of `rounds` interleaved rounds of `repeat` calls. Accuracy on the tiny checkpoint,
    # `ppl_windows` x 256 validation tokens; `recovery`, `distill`: steps x batch_size x seq_len
    # tokens; `kd`: KD loss; orders of D(istill) / P(rune) / Q(uantize); train text cut to `train_chars`;
    # `threads`: torch intra-op threads (1 in smoke: CI machines are shared; None = all cores).
    "pruning": {
        "smoke": {"threads": 1, "matmul_n": 4096, "sweep": [0.5, 0.7, 0.8, 0.9, 0.95, 0.99],
                  "sparsities": [0.5, 0.75], "speed_preset": "small",
                  "speed_overrides": {"n_layers": 4, "vocab_size": 4096},
                  "repeat": 3, "rounds": 2, "ppl_windows": 2, "calib_windows": 2, "train_chars": 300_000,
                  "recovery": {"steps": 3, "batch_size": 4, "seq_len": 64, "lr": 3e-4},
                  "distill": {"steps": 12, "batch_size": 4, "seq_len": 64},
                  "kd": {"temperature": 1.0, "kd_weight": 1.0}, "student_overrides": {"n_layers": 2},
                  "orders": ["DPQ", "PDQ", "QDP"], "order_sparsity": 0.5},
        "full": {"threads": None, "matmul_n": 4096,
                 "sweep": [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99],
                 "sparsities": [0.5, 0.75], "speed_preset": "small", "speed_overrides": {},
                 "repeat": 10, "rounds": 3, "ppl_windows": 16, "calib_windows": 4, "train_chars": None,
                 "recovery": {"steps": 20, "batch_size": 8, "seq_len": 256, "lr": 3e-4},
                 "distill": {"steps": 120, "batch_size": 8, "seq_len": 256},
                 "kd": {"temperature": 1.0, "kd_weight": 1.0}, "student_overrides": {"n_layers": 2},
                 "orders": ["DPQ", "PDQ", "QDP"], "order_sparsity": 0.5},
    },
    # 07_kv_and_result_cache: the engine serves `engine_requests` mixed-length requests
    # (lognormal, medians in tokens) at a KV budget of `engine_budget_tokens` fp32 tokens' worth of
    # bytes; int8 KV: `int8_requests` (enough that int8's memory, not the workload, bounds
    # concurrency), perplexity on `ppl_windows` x 256 tokens, decode speed of `speed_batch` sequences
    # of `speed_tokens` prompt + `speed_tokens` output tokens; the semantic cache: encoder ("auto":
    # MiniLM if the embed extra is installed), isolation test on `isolation_pairs` pairs (None: all),
    # hit path vs model call through `labkit serve`.
    "kv_cache": {
        "smoke": {"engine_requests": 48, "int8_requests": 112, "engine_max_len": 256,
                  "engine_budget_tokens": 1024, "prompt_median": 32, "output_median": 32,
                  "block_sizes": [4, 16, 64], "ppl_windows": 4, "speed_batch": 8, "speed_tokens": 32,
                  "speed_repeat": 1, "encoder": "auto", "isolation_pairs": 20, "latency_prompts": 10, "latency_repeat": 1,
                  "index_sizes": [1000, 10000], "server_cache": "semantic", "server_requests": 4,
                  "server_max_tokens": 16},
        "full": {"engine_requests": 512, "int8_requests": 1024, "engine_max_len": 512,
                 "engine_budget_tokens": 8192, "prompt_median": 64, "output_median": 64,
                 "block_sizes": [1, 4, 8, 16, 32, 64, 128], "ppl_windows": 16, "speed_batch": 16, "speed_tokens": 64,
                 "speed_repeat": 3, "encoder": "auto", "isolation_pairs": None, "latency_prompts": 50, "latency_repeat": 3,
                 "index_sizes": [1000, 10000, 100000], "server_cache": "semantic", "server_requests": 16,
                 "server_max_tokens": 64},
    },
    # 08_p99_and_load: real server (tiny preset, 1 torch thread) + load generator.
    # calib_*: black-box calibration (closed loops at calib_users x calib_contexts prompt tokens,
    # calib_output tokens, calib_rounds rounds; TTFT at calib_prompts). c19_*: TailMix traffic
    # at c19_rate req/s. sweep_users: closed-loop concurrency levels, sweep_rounds requests per
    # user (at least sweep_min) of sweep_len prompt and output tokens, sweep_s cap per level. levels: offered rate as a
    # share of the predicted knee, with level_requests each (the "overloaded" trace also runs
    # under `policies`). target_points: rates of the equal-p99 throughput sweep per policy
    # (skipped when 0), each about target_s s of arrivals (target_requests = [min, max]).
    "serving": {
        "smoke": {"calib_users": [1, 2, 8], "calib_contexts": [16, 128], "calib_output": 32, "calib_rounds": 2,
                  "calib_prompts": [16, 128], "calib_repeat": 3,
                  "c19_requests": 50, "c19_rate": 6.0,
                  "sweep_users": [1, 2, 4, 8, 16, 32], "sweep_rounds": 2, "sweep_min": 6, "sweep_len": 32,
                  "sweep_s": 8.0,
                  "levels": {"low": 0.3, "near knee": 1.0, "overloaded": 1.6},
                  "level_requests": {"low": 20, "near knee": 40, "overloaded": 40},
                  "policies": ["static", "continuous"], "target_points": 0, "target_s": 0, "target_requests": [0, 0]},
        "full": {"calib_users": [1, 2, 4, 8, 12, 16], "calib_contexts": [16, 128], "calib_output": 48, "calib_rounds": 2,
                 "calib_prompts": [16, 64, 192], "calib_repeat": 3,
                 "c19_requests": 300, "c19_rate": 4.0,
                 "sweep_users": [1, 2, 4, 8, 16, 32, 64], "sweep_rounds": 4, "sweep_min": 16, "sweep_len": 48,
                 "sweep_s": 30.0,
                 "levels": {"low": 0.3, "near knee": 1.0, "overloaded": 1.6},
                 "level_requests": {"low": 100, "near knee": 200, "overloaded": 200},
                 "policies": ["none", "static", "continuous"], "target_points": 6, "target_s": 30,
                 "target_requests": [60, 300]},
    },
    # 09_case_study: requests per load run, one-at-a-time requests for the unloaded baseline,
    # closed-loop requests of the capacity run, seconds the stack sampler runs during the load,
    # overload rate as a multiple of the measured capacity, burst size as a multiple of the queue bound.
    "case": {
        "smoke": {"requests": 120, "unloaded_requests": 12, "capacity_requests": 64, "profile_s": 8.0,
                  "overload": 1.5, "burst": 3},
        "full": {"requests": 300, "unloaded_requests": 40, "capacity_requests": 160, "profile_s": 20.0,
                 "overload": 1.5, "burst": 3},
    },
    # labkit.benches.overhead: closed-loop users (= the server's max batch), requests per run,
    # prompt words and output tokens per request, interleaved rounds of the three ways.
    # `labkit ledger`'s own run sizes where a claim's run differs from its notebook's: C3's
    # interleaved rounds, torch threads for C10/C11 (None: all cores), C15's chat requests on the
    # real server, C16's interactive requests, C18's new tokens per answer (48: chapter 6's mean
    # chat output), C19's trace as a multiple of the serving preset's requests.
    "ledger": {
        "smoke": {"c3_rounds": 3, "c10_threads": 1, "c15_requests": 80, "c16_interactive": 60,
                  "c18_new_tokens": 48, "c19_repeat": 2},
        "full": {"c3_rounds": 5, "c10_threads": None, "c15_requests": 300, "c16_interactive": 200,
                 "c18_new_tokens": 128, "c19_repeat": 1},
    },
    # The chapter benches' own sizes (`python -m labkit.benches.quant`, `.cache`): perplexity
    # windows and C10's decode repeats; the cache's lookup repeats, index sizes (entries) and
    # requests through the real server.
    "bench_quant": {
        "smoke": {"ppl_windows": 4, "c10_repeat": 5},
        "full": {"ppl_windows": 16, "c10_repeat": 20},
    },
    "bench_cache": {
        "smoke": {"lookup_repeat": 1, "index_sizes": [1_000, 10_000], "server_requests": 4},
        "full": {"lookup_repeat": 3, "index_sizes": [1_000, 10_000, 100_000], "server_requests": 8},
    },
    # `python -m labkit.benches.check`: triad rounds, square GEMM sizes and their paired rounds.
    "bench_check": {
        "smoke": {"triad_rounds": 5, "matmul_sizes": [512, 1024], "matmul_rounds": 3},
        "full": {"triad_rounds": 10, "matmul_sizes": [1024, 2048], "matmul_rounds": 5},
    },
    "serve_overhead": {
        "smoke": {"batch": 16, "chunk": 16, "prompt": 32, "output": 64, "cycles": 4},
        "full": {"batch": 16, "chunk": 32, "prompt": 32, "output": 128, "cycles": 12},
    },
}


# Chapters whose "auto" is "full" on every device: the case study's tail is a queue behind a lock,
# and a smoke run (60 requests, the queue starting empty) is too short for it to form, so its
# story (an SLO missed, then found and fixed) shows only at full size (about 6 min on 2 cores).
AUTO_FULL = frozenset({"case"})


def resolve_size(size: str, device: Any = "cpu", chapter: str | None = None) -> str:
    """Validate `size` and turn "auto" into "full" (GPU, or a chapter in AUTO_FULL) or "smoke" (CPU/MPS)."""
    if not isinstance(size, str) or size.lower() not in SIZE_CHOICES:
        raise ValueError(f"SIZE={size!r} is not allowed; choose one of {', '.join(map(repr, SIZE_CHOICES))}")
    size = size.lower()
    if size == "auto":
        kind = str(device).split(":")[0]  # a torch.device or its name: "cuda:0" -> "cuda"
        return "full" if kind == "cuda" or chapter in AUTO_FULL else "smoke"
    return size


def sizes(chapter: str, size: str, device: Any = "cpu") -> dict[str, Any]:
    """The problem sizes of `chapter` at `size` (validated, "auto" resolved) on `device`."""
    if chapter not in SIZES:
        raise ValueError(f"unknown chapter {chapter!r}; known: {', '.join(sorted(SIZES))}")
    return dict(SIZES[chapter][resolve_size(size, device, chapter)])
