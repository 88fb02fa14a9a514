"""Problem sizes: the one place that maps SIZE ("smoke" | "full" | "auto") to numbers.

`smoke` keeps every notebook well under two minutes on 2 CPU cores (CI); `full` is
sized to show each effect clearly on a real GPU, and in minutes on a laptop CPU.
`auto` means full on a GPU and smoke on CPU. Chapters add their own entry to
`SIZES`; notebooks read theirs with `sizes(chapter, SIZE, device)`.
"""

from __future__ import annotations

from typing import Any

import torch

SIZE_CHOICES = ("smoke", "full", "auto")

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
    # 06_batching: requests per simulation, load-sweep points, decoder calibration sweep.
    "batching": {
        "smoke": {"requests": 4000, "queue_requests": 20_000, "sweep_requests": 1500, "sweep_points": 8, "mixed_requests": 1500,
                  "calib_batches": [1, 8], "calib_contexts": [64], "calib_prompts": [32, 128], "calib_repeat": 3},
        "full": {"requests": 100_000, "queue_requests": 200_000, "sweep_requests": 20_000, "sweep_points": 14, "mixed_requests": 20_000,
                 "calib_batches": [1, 4, 16, 64], "calib_contexts": [64, 512], "calib_prompts": [32, 128, 512],
                 "calib_repeat": 10},
    },
}


def resolve_size(size: str, device: torch.device | str = "cpu") -> str:
    """Validate `size` and turn "auto" into "full" (GPU) or "smoke" (CPU/MPS)."""
    if not isinstance(size, str) or size.lower() not in SIZE_CHOICES:
        raise ValueError(f"SIZE={size!r} is not allowed; choose one of {', '.join(map(repr, SIZE_CHOICES))}")
    size = size.lower()
    if size == "auto":
        kind = torch.device(device).type
        return "full" if kind == "cuda" else "smoke"
    return size


def sizes(chapter: str, size: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The problem sizes of `chapter` at `size` (validated, "auto" resolved) on `device`."""
    if chapter not in SIZES:
        raise ValueError(f"unknown chapter {chapter!r}; known: {', '.join(sorted(SIZES))}")
    return dict(SIZES[chapter][resolve_size(size, device)])
