"""Chapter 5's engine-level measurements for the ledger's claims C15-C18 (the ledger,
`labkit.ledger.ch5`, predicts and judges; these functions only measure).

* C15: `engine_step_times`, decode steps of the real engine at several batch sizes;
* C16: `engine_capacity`, `measure_c16`: interactive requests with and without a stream of
  offline jobs, FIFO vs priority, on the engine in process;
* C17: `measure_kv_growth` (the KV tensor storage `generate` allocates), `c17_measure`;
* C18: `choose_c18` / `heldout_c18` (a threshold on the labelled pairs), `measure_c18_trace`
  (a trace with repeats served with and without the semantic cache), `trace_c18`.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from labkit import presets
from labkit.device import threads
from labkit.model import load_tiny
from labkit.model.generate import generate
from labkit.serve import cache_eval as cb
from labkit.serve import kv_capacity as kb
from labkit.serve.cache import SemanticCache, normalize_prompt
from labkit.serve.engine import Engine, EngineConfig
from labkit import scheduling
from labkit.stats import safe_threshold
from labkit.tokenizer import load_tokenizer


def engine_step_times(model: Any, batches: Sequence[int] = (1, 8), prompt: int = 64, steps: int = 24,
                      rounds: int = 3) -> dict[int, float]:
    """Seconds per decode step of the real engine (`labkit.serve.engine`) running `batch`
    sequences of a `prompt`-token prompt: every step after the prefill timed, the median per
    round, the best of `rounds` rounds interleaved across batches (a neighbour's burst then hits
    a round, not a batch size)."""
    gen = torch.Generator().manual_seed(0)
    best: dict[int, float] = {}
    for _ in range(rounds):
        for b in batches:
            eng = Engine(model, EngineConfig(policy="continuous", max_batch=b, max_queue=b + 1,
                                             max_model_len=prompt + steps + 8))
            for _ in range(b):
                eng.submit(torch.randint(0, model.config.vocab_size, (prompt,), generator=gen).tolist(), steps,
                           ignore_eos=True)
            eng.step()  # admits and prefills every sequence
            times = []
            while True:
                t0 = time.perf_counter()
                busy = eng.step()
                times.append(time.perf_counter() - t0)
                if not busy or not eng.running:
                    break
            best[b] = min(best.get(b, float("inf")), float(np.median(times[:-1] or times)))
    return best


def _drive(eng: Any, plan: Sequence[tuple[float, list[int], int, int]]) -> list[Any]:
    """Run `eng` in this thread, submitting each (at_s, prompt_ids, max_tokens, priority) when
    its time comes (arrival = its planned time, so a late submit still counts its wait)."""
    t0 = time.monotonic()
    order = sorted(range(len(plan)), key=lambda i: plan[i][0])
    reqs: list[Any] = [None] * len(plan)
    j = 0
    while True:
        now = time.monotonic() - t0
        while j < len(order) and plan[order[j]][0] <= now:
            at, ids, mt, pr = plan[order[j]]
            reqs[order[j]] = eng.submit(ids, mt, ignore_eos=True, priority=pr, arrival=t0 + at)
            j += 1
        if not eng.step():
            if j == len(order) and not (eng.running or eng.queue_depth):
                return reqs
            if j < len(order):
                time.sleep(max(0.0, min(0.005, t0 + plan[order[j]][0] - time.monotonic())))


def _engine(model: Any, queue: str, max_batch: int, n: int) -> Any:
    eng = Engine(model, EngineConfig(policy="continuous", max_batch=max_batch, max_queue=n + 1, max_model_len=256))
    # EngineConfig has no queue option: the same scheduler, ordering its queue by the
    # requests' `priority` (lower first) instead of by arrival alone.
    eng.policy = scheduling.make("continuous", max_batch=max_batch, queue=queue)
    eng.warmup()
    return eng


INTERACTIVE_OUT = 8  # tokens an interactive request generates (its prompt: 16 tokens)


def engine_capacity(model: Any, max_batch: int = 8, seed: int = 0) -> float:
    """Interactive requests/s the engine completes with its batch kept full (4 batches' worth
    submitted at once), measured now."""
    rng = np.random.default_rng(seed + 1)
    n = 4 * max_batch
    eng = _engine(model, "fifo", max_batch, n)
    plan = [(0.0, rng.integers(0, model.config.vocab_size, 16).tolist(), INTERACTIVE_OUT, 0) for _ in range(n)]
    t0 = time.perf_counter()
    _drive(eng, plan)
    return n / (time.perf_counter() - t0)


# C16's traffic: interactive requests at INTERACTIVE_LOAD of the measured capacity, offline
# jobs streaming in at OFFLINE_LOAD of it (in interactive-request units of work): together
# ~95 %, a busy server with headroom, not an overloaded one (where any FIFO must lose).
INTERACTIVE_LOAD, OFFLINE_LOAD, OFFLINE_OUT = 0.3, 0.65, 48.0


def offline_rate(capacity_rps: float, offline_load: float = OFFLINE_LOAD, offline_out: float = OFFLINE_OUT) -> float:
    """Offline jobs/s whose decode work is `offline_load` x the capacity (interactive requests/s)."""
    return offline_load * capacity_rps * INTERACTIVE_OUT / offline_out


def measure_c16(model: Any, capacity_rps: float, *, max_batch: int = 8, backlog: int | None = None,
                interactive: int = 40, load: float = INTERACTIVE_LOAD, seed: int = 0,
                offline_load: float = OFFLINE_LOAD) -> dict[str, Any]:
    """Interactive requests (16-token prompts, 8 tokens out, priority 0) at `load` x
    `capacity_rps`, interleaved with offline jobs (32-token prompts, lognormal outputs ~48
    tokens, priority 1) arriving as a Poisson stream at `offline_rate(capacity, offline_load)`
    over the same window (`backlog` jobs; None: as many as the stream brings in that window);
    p99 TTFT (s) of the interactive class alone, mixed under FIFO, mixed under priority."""
    rng = np.random.default_rng(seed)
    vocab, out_i = model.config.vocab_size, INTERACTIVE_OUT
    inter = [rng.integers(0, vocab, 16).tolist() for _ in range(interactive)]
    rate = load * capacity_rps
    at = 0.05 + np.cumsum(rng.exponential(1 / rate, interactive))
    off_rate = offline_rate(capacity_rps, offline_load)
    n_off = backlog if backlog is not None else max(1, int(round(off_rate * at[-1])))
    off_at = 0.05 + np.cumsum(rng.exponential(1 / off_rate, n_off))
    off_out = np.clip(rng.lognormal(np.log(OFFLINE_OUT), 0.5, n_off).round(), 8, 128).astype(int)
    offline = [(float(t), rng.integers(0, vocab, 32).tolist(), int(o), 1) for t, o in zip(off_at, off_out)]
    online = [(float(t), ids, out_i, 0) for t, ids in zip(at, inter)]
    out: dict[str, Any] = {"capacity_rps": capacity_rps, "interactive_rps": rate, "offline_rps": off_rate,
                           "offline_out": float(off_out.mean()), "max_batch": max_batch, "backlog": n_off,
                           "interactive_out": out_i}
    for name, queue, plan in (("alone", "fifo", online), ("fifo", "fifo", online + offline),
                              ("priority", "priority", online + offline)):
        reqs = _drive(_engine(model, queue, max_batch, len(plan)), plan)
        out[name] = float(np.percentile([r.ttft for r in reqs[:interactive]], 99))
        out[f"offline_done_{name}"] = sum(r.state == "done" for r in reqs[interactive:])
    return out


def allocated_bytes(cache: Any) -> int:
    """Bytes of tensor storage a KV cache object holds: every tensor attribute's storage,
    each storage counted once (views share one), read from the storages themselves."""
    seen: dict[int, int] = {}
    for t in vars(cache).values():
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def measure_kv_growth(model: Any, batches: Sequence[int] = (1, 4, 16), lengths: Sequence[int] = (100, 200, 400),
                      new_tokens: int = 2, kv_dtype: str = "model") -> list[tuple[int, int, int]]:
    """(batch, tokens per sequence, KV bytes allocated): `labkit.model.generate` of `batch`
    prompts of `length` tokens plus `new_tokens`, the cache it allocated captured (its own
    sizing, `kv_dtype` "model" or "int8") and its tensor storage measured (`allocated_bytes`).
    Nothing here computes bytes from a formula: the calculator is what the judge compares with."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    own = model.new_cache
    for b in batches:
        for t in lengths:
            made: list[Any] = []

            def capture(*a: Any, **k: Any) -> Any:  # the cache generate sizes for itself
                made.append(own(*a, **{**k, "kv_dtype": kv_dtype}))
                return made[-1]
            model.new_cache = capture
            try:
                generate(model, torch.randint(0, model.config.vocab_size, (b, t), generator=gen),
                         max_new_tokens=new_tokens)
            finally:
                del model.new_cache  # the class's method again
            rows.append((b, t + new_tokens, sum(allocated_bytes(c) for c in made)))
    return rows


def c17_measure(setup: dict[str, Any]) -> dict[str, Any]:
    """KV growth on the engine, and peak running sequences: paged vs max-length, int8 vs model dtype."""
    model, budget = setup["model"], setup["budget"]
    out: dict[str, Any] = {"growth": measure_kv_growth(model), "int8_growth": measure_kv_growth(model, kv_dtype="int8")}
    for name, wl, kw in (("paged", setup["wl"], {"kv_reserve": "on_demand"}),
                         ("max_len", setup["wl"], {"kv_reserve": "max_len"}),
                         ("int8", setup["wl8"], {"kv_dtype": "int8"}), ("model", setup["wl8"], {"kv_dtype": "model"})):
        out[name] = kb.run(model, wl, budget, **kw)["peak_running"]
    return out


def _non_identical(pairs: list[dict]) -> np.ndarray:
    """Pairs whose prompts still differ once prepared as the semantic cache prepares them."""
    return np.array([normalize_prompt(p["a"]).lower() != normalize_prompt(p["b"]).lower() for p in pairs])


def choose_c18(encoder: Any, precision: float = 0.99) -> dict[str, Any]:
    """On data/cache_eval/pairs.jsonl only: the lowest threshold (cosine alone, or with the
    lexical guard: whichever reuses more) from which hit precision on NON-IDENTICAL pairs
    stays >= `precision` (threshold None if none does)."""
    pairs = cb.load_pairs()
    ev, m = cb.evaluate(encoder, pairs), _non_identical(pairs)
    best = None
    for name, allowed in (("cosine", None), ("guarded", ev["allowed"])):
        rows = cb.sweep(ev["scores"][m], ev["same_mask"][m], None if allowed is None else allowed[m])
        safe = safe_threshold(rows, precision)
        if safe and (best is None or safe["true_hits"] > best[1]["true_hits"]):
            best = (name, safe)
    out: dict[str, Any] = {"encoder": encoder.name, "variant": None, "threshold": None}
    if best is not None:
        out.update(variant=best[0], threshold=best[1]["threshold"], train_hit_rate=best[1]["hit_rate"])
    return out


def heldout_c18(encoder: Any, chosen: dict[str, Any]) -> dict[str, int]:
    """Hits of the chosen threshold on data/cache_eval/heldout.jsonl's non-identical pairs."""
    held = cb.load_pairs("heldout.jsonl")
    hv, hm = cb.evaluate(encoder, held), _non_identical(held)
    out = {"held_same": int((hv["same_mask"] & hm).sum()), "held_true": 0, "held_false": 0}
    if chosen["threshold"] is not None:
        hit = (hv["scores"] >= chosen["threshold"]) & hm & (hv["allowed"] if chosen["variant"] == "guarded" else True)
        out.update(held_true=int((hit & hv["same_mask"]).sum()), held_false=int((hit & ~hv["same_mask"]).sum()))
    return out


def measure_c18(encoder: Any) -> dict[str, Any]:
    """`choose_c18` then `heldout_c18`, in one dict."""
    chosen = choose_c18(encoder)
    return {**chosen, **heldout_c18(encoder, chosen)}


def c18_trace(pairs: Sequence[dict], seed: int = 0) -> list[tuple[str, int, str]]:
    """A request trace with repeats: the first prompt of every pair (shuffled), then every
    second prompt (shuffled). (prompt, pair index, "first" | "second"); a "second" of a
    same-meaning pair repeats earlier work, one of a different-meaning pair does not."""
    rng = np.random.default_rng(seed)
    firsts = [(p["a"], i, "first") for i, p in enumerate(pairs)]
    seconds = [(p["b"], i, "second") for i, p in enumerate(pairs)]
    return [firsts[j] for j in rng.permutation(len(firsts))] + [seconds[j] for j in rng.permutation(len(seconds))]


def measure_c18_trace(encoder: Any, chosen: dict[str, Any], model: Any, tokenizer: Any, pairs: Sequence[dict],
                      max_new_tokens: int = 16, seed: int = 0) -> dict[str, Any]:
    """`c18_trace(pairs)` served twice, request by request interleaved (a neighbour's burst hits
    both alike): every request through the model (`generate`, greedy, `max_new_tokens`), and
    through the semantic cache at the chosen threshold (model only on a miss). Counts model
    calls, times each request (s), and scores each hit: right only when it reuses the answer
    of the same prompt asked before, or of a same-meaning pair's first prompt."""
    if chosen["threshold"] is None:
        raise ValueError("no threshold was chosen (choose_c18 found none): nothing to serve with")
    cache = SemanticCache(encoder, chosen["threshold"], guard=chosen["variant"] == "guarded")
    params = {"temperature": 0, "max_tokens": max_new_tokens}

    def answer(prompt: str) -> str:
        return tokenizer.decode(generate(model, [tokenizer.encode(prompt)], max_new_tokens=max_new_tokens)[0])

    answer("warm-up")
    cache.lookup("warm-up", "warm-up", params)
    trace = c18_trace(pairs, seed)
    base_s, cached_s, calls, right, wrong, repeats = [], [], 0, 0, 0, 0
    asked: set[str] = set()
    for prompt, i, role in trace:
        norm = normalize_prompt(prompt)
        same_as_a = role == "second" and pairs[i]["label"] == "same"
        # a repeat: the same meaning was asked before (the same prompt, or a same-meaning pair's second)
        repeats += norm.lower() in asked or same_as_a
        asked.add(norm.lower())
        t0 = time.perf_counter()
        answer(prompt)
        base_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hit = cache.lookup("ledger", prompt, params)
        if hit is None:
            cache.put("ledger", prompt, params, answer(prompt))
            calls += 1
        cached_s.append(time.perf_counter() - t0)
        if hit is not None:
            ok = hit.prompt.lower() == norm.lower() or (same_as_a and hit.prompt == normalize_prompt(pairs[i]["a"]))
            right, wrong = right + ok, wrong + (not ok)
    return {"requests": len(trace), "repeats": repeats, "model_calls": calls, "right_hits": right,
            "wrong_hits": wrong, "base_mean_s": float(np.mean(base_s)), "cached_mean_s": float(np.mean(cached_s))}


def trace_c18(encoder: Any, chosen: dict[str, Any], size: str = "smoke", model: Any = None) -> dict[str, Any] | None:
    """`measure_c18_trace` on the held-out pairs with the trained tiny model (one torch thread;
    48 new tokens per answer, the mean output of chapter 6's chat traffic; full: 128);
    None when no threshold was chosen."""
    if chosen["threshold"] is None:
        return None
    with threads(1):
        return measure_c18_trace(encoder, chosen, model or load_tiny(), load_tokenizer(),
                                 cb.load_pairs("heldout.jsonl"), max_new_tokens=presets.sizes("ledger", size)["c18_new_tokens"])
