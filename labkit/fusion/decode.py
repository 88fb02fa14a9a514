"""Graph capture of the decoder's decode step (claims C6, C7 on the real model).

One decode step of a small decoder is hundreds of small ops: each pays the eager
per-op cost (Python + dispatcher on a CPU; plus a kernel launch on a GPU).
``torch.compile`` traces the step into one graph and fuses its elementwise ops
(fewer kernels, less traffic); on a GPU, CUDA graphs (``mode="reduce-overhead"``)
additionally replay the whole step with one launch. The static KV cache
(``new_cache(..., static=True)``) keeps every step's shapes equal, so nothing recompiles.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from labkit.device import threads as torch_threads
from labkit.fusion.count import compile_counted, count_ops
from labkit.timing import time_decode_steps

VARIANTS = ("eager", "compiled", "cuda_graph")


@dataclasses.dataclass
class DecodeResult:
    """One variant at one batch: median and fastest seconds per decode step (on a shared
    CPU the fastest repeat is the least disturbed), ops/kernels per step, ATen graph
    nodes (compiled variants only) and the first call's seconds (includes compiling)."""

    variant: str
    batch: int
    step_s: float
    best_s: float
    ops: int
    kernels: int
    graph_nodes: int | None
    first_call_s: float


class DecodeBench:
    """Decode steps of `model` on a static cache holding `context` tokens, per batch size.

    The cache is rewound to `context` before every timed call
    (`labkit.timing.time_decode_steps`), so every step attends over the same number of slots.
    """

    def __init__(self, model: torch.nn.Module, *, context: int = 32, max_len: int = 128, seed: int = 0):
        if not 1 <= context < max_len:
            raise ValueError(f"need 1 <= context < max_len, got context={context}, max_len={max_len}")
        self.model, self.context, self.max_len, self.seed = model.eval(), context, max_len, seed
        self._caches: dict[int, Any] = {}

    def _cache(self, batch: int):
        if batch not in self._caches:
            g = torch.Generator().manual_seed(self.seed)
            prompt = torch.randint(0, self.model.config.vocab_size, (batch, self.context), generator=g)
            cache = self.model.new_cache(batch, self.max_len, static=True)
            with torch.inference_mode():
                self.model.prefill(prompt.to(self.model.device), cache)
            self._caches[batch] = cache
        cache = self._caches[batch]
        cache.rewind(self.context)
        return cache

    def run(self, variant: str, batches: list[int], *, repeat: int = 10,
            threads: int | None = None) -> list[DecodeResult]:
        """Time `variant` ("eager" | "compiled" | "cuda_graph") at each batch size, with
        torch on `threads` intra-op threads (None: as is). Compiled variants compile on
        their first call at each batch (dynamic=False; the thread count is part of
        inductor's cache key, so a new count compiles afresh).

        Why `threads`: inductor's CPU kernels are OpenMP loops with a barrier at the end
        of each; on a shared machine where another process holds a core, every barrier
        waits for a descheduled thread and a compiled step can be 10x slower than eager.
        One thread measures the overhead story without that scheduling noise."""
        with torch_threads(threads):
            return self._run(variant, batches, repeat)

    def _run(self, variant: str, batches: list[int], repeat: int) -> list[DecodeResult]:
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r}; choose one of {VARIANTS}")
        dev = self.model.device
        if variant == "cuda_graph" and dev.type != "cuda":
            raise ValueError("variant='cuda_graph' needs a CUDA model")
        model = self.model
        rec = None
        if variant == "compiled":
            compiled, rec = compile_counted(model._decode_logits, dynamic=False)
            model._decode_fn = compiled
        elif variant == "cuda_graph":
            model.compile_decode(dynamic=False, mode="reduce-overhead")
        out = []
        try:
            for b in batches:
                if b < 1:
                    raise ValueError(f"batch sizes must be >= 1, got {b}")
                tok = torch.zeros(b, dtype=torch.long, device=dev)
                n_graphs = len(rec.graphs) if rec else 0
                steps = repeat + 6
                if self.context + steps >= self.max_len:
                    raise ValueError(f"max_len={self.max_len} too small for context={self.context} + {steps} steps")
                with torch.inference_mode():
                    cache = self._cache(b)
                    t0 = time.perf_counter()
                    model.decode_step(tok, cache)
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    first = time.perf_counter() - t0
                    t = time_decode_steps(model, cache, tok, self.context, warmup=2, repeat=repeat)
                    counts = count_ops(lambda: model.decode_step(tok, cache), device=dev, warmup=0)
                nodes = sum(rec.graphs[n_graphs:]) if rec else None
                out.append(DecodeResult(variant, b, t.median, t.min, counts.ops, counts.kernels, nodes, first))
        finally:
            if "_decode_fn" in model.__dict__:
                del model.__dict__["_decode_fn"]  # back to eager for the next caller
        return out
