"""KV-cache memory on the real engine: paged vs max-length reservation, block size, int8.

(``python -m labkit.benches.kv`` prints the figures.)

Every run serves the same mix of request lengths with the trained tiny decoder through
`labkit.serve.engine.Engine` (continuous batching) at one fixed KV memory budget in
bytes, converted to blocks with `labkit.model.kv_memory`. After each engine step the
block manager's counts are read: tokens stored (used) vs token slots held (reserved).

* waste = 1 − Σ used / Σ reserved over all steps (time-weighted: a step counts once);
* max concurrency = the most sequences that ran at once (`peak_running`) with a batch
  limit far above what memory allows, so memory is what binds.

Prompts are random token ids and outputs run to their length (``ignore_eos``): memory
accounting does not depend on the text, and lengths stay exactly as drawn.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np
import torch

from labkit.model import Transformer
from labkit.model.kv_memory import kv_bytes_per_token, kv_cache_bytes, kv_dtype_name, stored_as
from labkit.serve import paged
from labkit.serve.engine import Engine, EngineConfig
from labkit.plots import axes
from labkit.report import format_rows


@dataclasses.dataclass(frozen=True)
class LengthMix:
    """Request lengths in tokens: prompt[i] + output[i] <= max_len."""

    prompt: np.ndarray
    output: np.ndarray
    max_len: int

    @property
    def mean_live_tokens(self) -> float:
        """Tokens an average running sequence holds, time-weighted: a request holds p + k
        tokens at its k-th decode step, so over its o steps it averages p + (o + 1) / 2."""
        o = self.output.astype(float)
        return float(np.sum((self.prompt + (o + 1) / 2) * o) / np.sum(o))


def mixed_workload(n: int, prompt_median: int, output_median: int, max_len: int, sigma: float = 0.8,
                   seed: int = 0) -> LengthMix:
    """`n` requests with lognormal prompt and output lengths (medians in tokens), each
    clipped so that prompt + output <= `max_len` (a chat-like mix: many short, a long tail)."""
    if n < 1 or min(prompt_median, output_median) < 1 or max_len < 4:
        raise ValueError(f"need n >= 1, medians >= 1 and max_len >= 4 tokens; got {n}, {prompt_median}, "
                         f"{output_median}, {max_len}")
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.lognormal(np.log(prompt_median), sigma, n).round(), 1, max_len // 2).astype(int)
    output = np.clip(rng.lognormal(np.log(output_median), sigma, n).round(), 1, max_len - prompt).astype(int)
    return LengthMix(prompt, output, max_len)


def blocks_for_budget(model: Transformer, budget_bytes: int, block_size: int, kv_dtype: str = "model") -> int:
    """KV blocks of `block_size` tokens that fit in `budget_bytes` for `model` and `kv_dtype`."""
    per_token = kv_bytes_per_token(model.config, stored_as(model.dtype, kv_dtype))
    return int(budget_bytes // (block_size * per_token))


def run(model: Transformer, wl: LengthMix, budget_bytes: int, *, block_size: int = 16, kv_reserve: str = "on_demand",
        kv_dtype: str = "model", max_batch: int = 512, seed: int = 0) -> dict[str, Any]:
    """Serve `wl` at `budget_bytes` of KV memory; the module doc defines the figures."""
    blocks = blocks_for_budget(model, budget_bytes, block_size, kv_dtype)
    cfg = EngineConfig(policy="continuous", max_batch=max_batch, max_queue=len(wl.prompt) + 1, block_size=block_size,
                       kv_blocks=blocks, kv_dtype=kv_dtype, kv_reserve=kv_reserve, max_model_len=wl.max_len,
                       watermark=0.0, token_budget=max(512, wl.max_len), seed=seed)
    eng = Engine(model, cfg)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    reqs = [eng.submit(torch.randint(0, vocab, (int(p),), generator=gen).tolist(), int(o), ignore_eos=True)
            for p, o in zip(wl.prompt, wl.output)]
    used = reserved = running = steps = 0
    limit = 10 * int(wl.prompt.sum() + wl.output.sum())  # far more steps than any schedule needs
    t0 = time.perf_counter()
    while eng.step() or eng.running or eng.queue_depth:
        if steps > limit:
            raise RuntimeError(f"engine still busy after {steps} steps: {eng.kv_stats()}")
        s = eng.kv_stats()
        used, reserved, running, steps = used + s["tokens_used"], reserved + s["tokens_reserved"], \
            running + s["running"], steps + 1
    wall = time.perf_counter() - t0
    generated = sum(len(r.tokens) for r in reqs)
    assert generated == int(wl.output.sum()), "every request must get exactly its output length"
    dtype_name = kv_dtype_name(stored_as(model.dtype, kv_dtype))
    return dict(kv_reserve=kv_reserve, block_size=block_size, kv_dtype=dtype_name, budget_bytes=budget_bytes,
                blocks=blocks, capacity_tokens=blocks * block_size,
                bytes_per_token=kv_bytes_per_token(model.config, stored_as(model.dtype, kv_dtype)),
                pool_bytes=eng.pool.nbytes, steps=steps, wall_s=wall, tokens_per_s=generated / wall,
                waste=1 - used / reserved, peak_running=eng.peak_running, mean_running=running / steps,
                preemptions=sum(r.preemptions for r in reqs))


def predict(wl: LengthMix, capacity_tokens: int, block_size: int, kv_reserve: str) -> dict[str, float]:
    """What the arithmetic says before running: waste and max concurrency.

    max_len reservation: every sequence holds max_len slots, so concurrency is exact,
    capacity // max_len, and waste ≈ 1 − mean live tokens / max_len. Paged: a sequence
    wastes (block_size − 1) / 2 slots of its last block on average."""
    live = wl.mean_live_tokens
    if kv_reserve == "max_len":
        per_seq = -(-wl.max_len // block_size) * block_size
        return dict(waste=1 - live / per_seq, max_concurrency=capacity_tokens // per_seq)
    slack = (block_size - 1) / 2
    return dict(waste=slack / (live + slack), max_concurrency=capacity_tokens / (live + slack))


def decode_speed(model: Transformer, kv_dtype: str, batch: int = 8, prompt: int = 64, output: int = 64,
                 block_size: int = 16, repeat: int = 3, seed: int = 0) -> float:
    """Generated tokens/s of `batch` identical-length requests through the engine (best of
    `repeat` runs, fresh engine each, so int8 and model-dtype KV see the same work)."""
    wl = LengthMix(np.full(batch, prompt), np.full(batch, output), prompt + output)
    budget = kv_cache_bytes(model.config, batch, prompt + output, model.dtype, block_size)
    return max(run(model, wl, budget, block_size=block_size, kv_dtype=kv_dtype, max_batch=batch,
                   seed=seed)["tokens_per_s"] for _ in range(repeat))


def ragged_decode(model: Transformer, contexts: Sequence[int], block_size: int = 16, steps: int = 10,
                  rounds: int = 5) -> dict[str, float]:
    """Decode-step time (s) of one batch whose rows hold `contexts` tokens each, through the paged
    cache read ragged (rows grouped by length, `labkit.serve.paged.ragged_groups`) and read padded
    (every row to the longest), in `rounds` interleaved rounds of `steps` steps; each figure is the
    median over rounds of a round's median step. Returns {"ragged_s", "padded_s", "groups"}."""
    tables, first = [], 0
    for c in contexts:
        n = -(-(c + 1) // block_size)
        tables.append(list(range(first, first + n)))
        first += n
    pools = {k: paged.PagedKVCache(model.config, first, block_size, dtype=model.dtype, device=model.device, ragged=k)
             for k in (True, False)}
    tokens = torch.zeros(len(contexts), dtype=torch.long, device=model.device)
    per_round: dict[bool, list[float]] = {True: [], False: []}
    with torch.inference_mode():
        for _ in range(rounds):
            for ragged, pool in pools.items():
                times = []
                for _ in range(steps + 1):  # the first is a warm-up
                    view = pool.view(tables, contexts)  # the same contexts every step
                    t0 = time.perf_counter()
                    model.decode_step(tokens, view)
                    times.append(time.perf_counter() - t0)
                per_round[ragged].append(float(np.median(times[1:])))
    ends = [c + 1 for c in contexts]
    groups = len(paged.ragged_groups(ends, max(ends)))
    return {"ragged_s": float(np.median(per_round[True])), "padded_s": float(np.median(per_round[False])),
            "groups": groups}


def plot_block_sizes(rows: Sequence[dict], predicted: Sequence[dict], ax=None):
    """Measured waste and max concurrency vs block size (log axis), with the prediction."""
    ax = axes(ax, (6.5, 4))
    sizes = [r["block_size"] for r in rows]
    ax.plot(sizes, [100 * r["waste"] for r in rows], "o-", label="waste, measured")
    ax.plot(sizes, [100 * p["waste"] for p in predicted], "--", color="C0", label="waste, predicted")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV block size (tokens, log scale)")
    ax.set_ylabel("reserved but empty KV slots (%)")
    right = ax.twinx()
    right.plot(sizes, [r["peak_running"] for r in rows], "s-", color="C1", label="max concurrency, measured")
    right.set_ylabel("max sequences running at once")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper center")
    return ax


RUN_COLUMNS = ("kv_reserve", "block_size", "kv_dtype", "bytes_per_token", "capacity_tokens", "peak_running",
               "waste", "preemptions", "tokens_per_s")


def format_runs(rows: Sequence[dict]) -> str:
    """A table of `run` results: the columns that tell the reservation rules apart."""
    return format_rows(rows, RUN_COLUMNS, percent=("waste",))
