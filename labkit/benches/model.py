"""Decode benchmark: ``python -m labkit.benches.model [--size smoke|full] [--compile] [--cache-demo]``.

On the same weights and config it measures decode tokens/s of labkit and of
transformers' ``generate()`` (use_cache, greedy, fixed new-token count) at batch 1
and 8, for the tiny preset (the trained checkpoint when present) and the ~100 M
``small`` preset, prints the ratios, and the fraction of the memory roofline each
reaches: (weight bytes + KV bytes read per decode step) / step time, over the best
read bandwidth measured in this run on a large tensor.

Decode rate = batch · (N − 1) / (t(N new tokens) − t(1 new token)): subtracting a
1-token generation removes prefill and set-up for both libraries alike. The variants
are timed in interleaved rounds and the ratio is the median of the per-round ratios, so
on a shared machine other processes' load falls on both libraries alike. Before timing,
labkit chooses its linear layers' weight layout and matmul form per batch size by
measurement (`Transformer.tune_matmul`).

``--layouts`` times the small preset's linear layers at M = 1 and 8 in three
memory layouts (why batch 8 reaches a lower share of the roofline on a CPU).
``--cache-demo`` times 512 new tokens with and without the KV cache.
transformers is imported only here (and in tests), never by labkit's runtime.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from labkit.bench import read_copy_bandwidth
from labkit.benches import kit
from labkit.model.checkpoint import TINY_DIR, load_tiny
from labkit.model.generate import generate
from labkit.model.kv_memory import kv_bytes_per_token
from labkit.model.transformer import Transformer
from labkit.timing import measure, quiet_profiler

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# ------------------------------------------------------------------ bandwidth


# ------------------------------------------------------- same weights in HF form


def to_hf(model: Transformer):
    """A transformers LlamaForCausalLM holding exactly `model`'s weights (fp32, eval)."""
    import transformers

    cfg = model.config
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(hf_cfg)
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    sd = model.state_dict()
    out = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"],
           "lm_head.weight": sd["output.weight"]}
    for i in range(cfg.n_layers):
        p, s = f"model.layers.{i}.", f"layers.{i}."
        wq, wk, wv = sd[s + "attention.wqkv.weight"].split([q, kv, kv])
        gate, up = sd[s + "feed_forward.w13.weight"].chunk(2)
        out.update({p + "self_attn.q_proj.weight": wq, p + "self_attn.k_proj.weight": wk,
                    p + "self_attn.v_proj.weight": wv, p + "self_attn.o_proj.weight": sd[s + "attention.wo.weight"],
                    p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": sd[s + "feed_forward.w2.weight"],
                    p + "input_layernorm.weight": sd[s + "attention_norm.weight"],
                    p + "post_attention_layernorm.weight": sd[s + "ffn_norm.weight"]})
    # Row-major copies: transformers gets its weights laid out as it would load them
    # from a checkpoint, not in labkit's "kn" inference layout.
    hf.load_state_dict({k: v.clone(memory_format=torch.contiguous_format) for k, v in out.items()},
                       strict=False, assign=True)
    if cfg.tie_embeddings:
        hf.tie_weights()
    for name, buf in hf.named_buffers():  # rotary inv_freq was built on meta: rebuild on CPU
        if buf.is_meta:
            from labkit.model.transformer import rope_inv_freq
            mod = hf.get_submodule(name.rsplit(".", 1)[0])
            setattr(mod, name.rsplit(".", 1)[1], rope_inv_freq(cfg.head_dim, cfg.rope_theta))
            if hasattr(mod, "original_inv_freq"):
                mod.original_inv_freq = mod.inv_freq
    hf.generation_config.eos_token_id = None
    return hf.to(model.device).eval()  # the rebuilt rotary buffers follow the weights


# -------------------------------------------------------------------- timing


def decode_rate(run: Callable[[int], object], batch: int, new_tokens: int, repeat: int,
                device: torch.device | str = "cpu") -> dict[str, float]:
    """tokens/s and s/step of decode, from t(N) − t(1) (seconds, median of `repeat`).

    When load from other processes makes t(N) <= t(1) the difference says nothing: the
    rates come back NaN (shown as such) rather than as an absurd number."""
    t_n = measure(lambda: run(new_tokens), warmup=1, repeat=repeat, device=device).median
    t_1 = measure(lambda: run(1), warmup=1, repeat=max(3, repeat), device=device).median
    return _rate(batch, new_tokens, t_n, t_1)


def _rate(batch: int, new_tokens: int, t_n: float, t_1: float) -> dict[str, float]:
    if t_n <= t_1:
        return {"tok_s": float("nan"), "step_s": float("nan"), "total_s": t_n}
    step = (t_n - t_1) / (new_tokens - 1)
    return {"tok_s": batch / step, "step_s": step, "total_s": t_n}


def decode_rates(runs: dict[str, Callable[[int], object]], batch: int, new_tokens: int, repeat: int,
                 device: torch.device | str = "cpu",
                 ceiling: tuple[float, Callable[[], object]] | None = None) -> dict[str, dict[str, float]]:
    """`decode_rate` of several variants measured side by side: each of `repeat` rounds
    times every variant once, so load from other processes falls on all of them alike.
    Adds ``ratio``: the median over rounds of this variant's tok/s over the first one's, and
    ``step_s_rounds``: its step time (s) per round. `ceiling`: (bytes, fn) timed once per round
    too (e.g. reading the model's weight matrices); its rate per round (bytes/s) comes back under
    the key "ceiling" as {"rounds": [...]}, so a share of it can be taken round by round."""
    times = {k: {"n": [], "1": []} for k in runs}
    reads: list[float] = []
    for fn in runs.values():
        fn(new_tokens)  # warm-up
    if ceiling:
        ceiling[1]()
    for _ in range(repeat):
        for k, fn in runs.items():
            times[k]["n"].append(measure(lambda: fn(new_tokens), warmup=0, repeat=1, device=device).median)
            times[k]["1"].append(measure(lambda: fn(1), warmup=0, repeat=1, device=device).median)
        if ceiling:
            reads.append(ceiling[0] / measure(ceiling[1], warmup=0, repeat=3, device=device).median)
    out: dict[str, dict] = {k: _rate(batch, new_tokens, statistics.median(t["n"]), statistics.median(t["1"]))
                            for k, t in times.items()}
    first = times[next(iter(runs))]
    for k, t in times.items():
        per_round = [_rate(batch, new_tokens, tn, t1)["step_s"] for tn, t1 in zip(first["n"], first["1"])]
        mine = [_rate(batch, new_tokens, tn, t1)["step_s"] for tn, t1 in zip(t["n"], t["1"])]
        out[k]["ratio"] = statistics.median(a / b for a, b in zip(per_round, mine))
        out[k]["step_s_rounds"] = mine
    if ceiling:
        out["ceiling"] = {"rounds": reads}
    return out


def share_of_ceiling(nbytes: float, step_s_rounds: list[float], ceiling_rounds: list[float]) -> float:
    """Median over rounds of (`nbytes` / step time) / the ceiling's rate in the same round: the
    share of a read ceiling a decode step reaches, with each round's load on both alike."""
    shares = [nbytes / s / c for s, c in zip(step_s_rounds, ceiling_rounds) if s == s and s > 0 and c > 0]
    return statistics.median(shares) if shares else float("nan")


def bytes_per_step(model: Transformer, batch: int, prompt_len: int, new_tokens: int) -> float:
    """Mean bytes one decode step must read: weights + every sequence's KV so far."""
    mean_ctx = prompt_len + new_tokens / 2
    kv = batch * mean_ctx * kv_bytes_per_token(model.config, model.dtype)
    return model.weight_bytes_per_step(batch) + kv


def matrix_reader(model: Transformer) -> tuple[float, Callable[[], None]]:
    """(bytes, fn): `fn` reads `model`'s weight matrices one after another, in the order a
    decode step does, with the simplest kernel there is (a sum of each)."""
    mats = [mod.weight.detach() for mod in model.modules() if isinstance(mod, torch.nn.Linear)]

    def read_all():
        with torch.inference_mode():
            for w in mats:
                w.sum()
    return float(sum(w.numel() * w.element_size() for w in mats)), read_all


def matrix_read_bandwidth(model: Transformer, repeat: int = 5) -> float:
    """Bytes/s at which this machine reads `model`'s weight matrices one after another, in
    the order a decode step does, with the simplest kernel there is (a sum of each): the
    practical ceiling of a layer-by-layer decoder. Next to the one-large-tensor read rate it
    shows what splitting the weights into many matrices (each a separate kernel call, its
    threads started and prefetchers ramped anew) costs before any matmul is involved."""
    nbytes, read_all = matrix_reader(model)
    return nbytes / measure(read_all, warmup=1, repeat=repeat, device=model.device).median


def bench_model(name: str, model: Transformer, *, batches: tuple[int, ...], prompt_len: int,
                new_tokens: int, repeat: int, bw: float, compile_: bool) -> list[dict]:
    hf = to_hf(model)
    rows = []
    g = torch.Generator().manual_seed(0)
    for b in batches:
        ids = torch.randint(1, min(model.config.vocab_size, 4096), (b, prompt_len), generator=g)
        ids = ids.to(model.device)
        ones = torch.ones_like(ids)

        def ours(n, m=model, static=False):
            return generate(m, ids, max_new_tokens=n, static_cache=static)

        def theirs(n):
            with torch.inference_mode():
                return hf.generate(ids, attention_mask=ones, max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, use_cache=True, pad_token_id=0)

        # Same weights must give the same greedy tokens before we time anything.
        agree = ours(8) == theirs(8)[:, prompt_len:].tolist()
        need = bytes_per_step(model, b, prompt_len, new_tokens)
        # transformers first: each variant's "ratio" is then its speed-up over transformers
        variants = {"transformers": theirs, "labkit": lambda n: ours(n)}
        compile_s = None
        if compile_:
            compiled, compile_s = compiled_model(model, b, prompt_len + new_tokens)
            variants["labkit+compile"] = lambda n: ours(n, compiled, static=True)
        res = decode_rates(variants, b, new_tokens, repeat, model.device, ceiling=matrix_reader(model))
        reads = res.pop("ceiling")["rounds"]
        for k, r in res.items():
            r["roofline"] = need / r["step_s"] / bw
            # the per-matrix read ceiling timed in the same rounds: the median of per-round shares
            r["matrix_roofline"] = share_of_ceiling(need, r["step_s_rounds"], reads)
        matrix_rounds = reads
        rows.append({"model": name, "params": model.num_params(), "batch": b, "agree": agree,
                     "bytes_per_step": need, "compile_s": compile_s, "matrix_read_rounds": matrix_rounds, **{
                         f"{k}_{f}": v for k, r in res.items() for f, v in r.items()}})
        line = f"{name:>6} b={b}: " + "  ".join(
            f"{k} {r['tok_s']:7.1f} tok/s ({100 * r['roofline']:4.0f}% roofline)" for k, r in res.items())
        line += f"  ratio {res['labkit']['ratio']:.2f}x"
        if compile_:
            line += (f"  compile-ratio {res['labkit+compile']['ratio']:.2f}x"
                     f" (compile {compile_s:.1f} s)")
        print(line + ("" if agree else "  [WARNING: greedy tokens differ]"), flush=True)
    return rows


def compiled_model(model: Transformer, batch: int, max_len: int) -> tuple[Transformer, float]:
    """`model` whose decode step is torch.compile'd (static cache shapes); returns it and
    the compile time in seconds (first prefill + decode calls)."""
    m = copy.copy(model)  # a shallow copy shares the weights; only the decode function differs
    # On a GPU, "reduce-overhead" replays the step as a CUDA graph: one launch per step.
    mode = "reduce-overhead" if model.device.type == "cuda" else "default"
    m.compile_decode(dynamic=False, mode=mode)
    t0 = time.perf_counter()
    with torch.inference_mode():
        cache = m.new_cache(batch, max_len, static=True)
        logits = m.prefill(torch.ones(batch, 4, dtype=torch.long, device=model.device), cache)
        for _ in range(2):
            logits = m.decode_step(logits.argmax(-1), cache)
    return m, time.perf_counter() - t0


# ----------------------------------------------------- batch-8 layout experiment


def linear_layouts(model: Transformer, ms: tuple[int, ...] = (1, 8), repeat: int = 20) -> list[dict]:
    """Time every distinct linear shape of `model` at M rows in three layouts:
    ``F.linear(x, W)`` (W: N×K, what nn.Linear does), ``x @ Wt`` (Wt: K×N contiguous)
    and ``(W @ x.T).T`` (GEMV-like: weights stream once per row block). Reports
    seconds per call and the achieved weight-read bandwidth (bytes/s)."""
    shapes = sorted({tuple(mod.weight.shape) for mod in model.modules() if isinstance(mod, torch.nn.Linear)})
    rows = []
    with torch.inference_mode():
        for n, k in shapes:
            w = torch.randn(n, k)
            wt = w.t().contiguous()
            for m in ms:
                x = torch.randn(m, k)
                ways = {"F.linear(x,W)": lambda: F.linear(x, w), "x@Wt": lambda: x @ wt,
                        "(W@x.T).T": lambda: (w @ x.t()).t()}
                for way, fn in ways.items():
                    t = measure(fn, warmup=3, repeat=repeat).median
                    rows.append({"N": n, "K": k, "M": m, "layout": way, "s": t, "GB_s": w.numel() * 4 / t / 1e9})
    return rows


# -------------------------------------------------------------------- profile


def profile_decode(model: Transformer, batch: int, steps: int = 32, prompt_len: int = 16,
                   rows: int = 15) -> str:
    """torch.profiler table (ops sorted by self CPU time) of `steps` labkit decode steps."""
    from torch.profiler import profile

    quiet_profiler()  # no kineto "USDT ... profiler_start" lines on stderr

    ids = torch.randint(1, model.config.vocab_size, (batch, prompt_len),
                        generator=torch.Generator().manual_seed(0))
    generate(model, ids, max_new_tokens=steps)  # warm-up
    with profile() as prof:
        generate(model, ids, max_new_tokens=steps)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


# ------------------------------------------------------------------ cache demo


def cache_demo(model: Transformer, new_tokens: int = 512, prompt_len: int = 16) -> dict[str, float]:
    """Seconds to generate `new_tokens` greedily with and without the KV cache."""
    ids = torch.randint(1, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    out = {}
    for use_cache in (True, False):
        t0 = time.perf_counter()
        toks = generate(model, ids, max_new_tokens=new_tokens, use_cache=use_cache)
        out["cache_s" if use_cache else "nocache_s"] = time.perf_counter() - t0
        out["tokens_cache" if use_cache else "tokens_nocache"] = toks
    same = out.pop("tokens_cache") == out.pop("tokens_nocache")
    return {**out, "speedup": out["nocache_s"] / out["cache_s"], "identical": same,
            "new_tokens": new_tokens}


# ------------------------------------------------------------------------ main


def parser():
    """The shared bench flags plus the decode bench's own."""
    ap = kit.parser("labkit.benches.model", __doc__, devices=("cpu", "cuda", "mps"),
                         quick_help="fewer tokens and repeats (~1 min)")
    ap.add_argument("--presets", default="tiny,small", help="comma-separated presets to time")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--new-tokens", type=kit.positive_int, default=None,
                    help="decode steps timed (default 64, quick 24)")
    ap.add_argument("--prompt-len", type=kit.positive_int, default=16)
    ap.add_argument("--compile", action="store_true", help="also time a torch.compile'd decode step")
    ap.add_argument("--compile-presets", default="tiny",
                    help="presets the compile variant runs on (each batch compiles anew, ~45 s on 2 cores)")
    ap.add_argument("--layouts", action="store_true", help="time small's linears in three layouts")
    ap.add_argument("--cache-demo", action="store_true", help="KV cache vs use_cache=False at 512 tokens")
    ap.add_argument("--cache-demo-tokens", type=kit.positive_int, default=512)
    ap.add_argument("--profile", action="store_true", help="print an op profile of labkit decode")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="weights and KV dtype (default fp32)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with kit.session(args) as run:
        results = body(args, run.device)
        run.results = results
        run.summary = summarize(results["rows"])
    return run.rc


def summarize(rows: list[dict]) -> str:
    """One line: per preset and batch, labkit tok/s, its ratio to transformers and roofline share."""
    parts = [f"{r['model']} b{r['batch']} {r['labkit_tok_s']:.1f} tok/s "
             f"({r['labkit_ratio']:.2f}x transformers, "
             f"{100 * r['labkit_roofline']:.0f}% roofline){'' if r['agree'] else ' TOKENS DIFFER'}" for r in rows]
    return "; ".join(parts) or "no rows"


def body(args, dev: torch.device) -> dict:
    """Every section the flags ask for; returns all figures."""
    new_tokens = args.new_tokens or (24 if args.quick else 64)
    repeat = 3 if args.quick else 5
    batches = tuple(int(b) for b in args.batches.split(","))

    from labkit.device import describe
    dtype = DTYPES[args.dtype]
    info = describe(dev)
    print(f"{info.name}, {info.torch_threads} torch threads, torch {info.torch_version}, {args.dtype}")
    # Other processes' load decides how far these figures can be trusted: with more runnable
    # threads than cores, a 2-thread matmul can wait a whole scheduler slice for its partner.
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs" + (
        " (busy: absolute rates are low; the interleaved ratios are the figures to read)"
        if load > (os.cpu_count() or 1) else ""), flush=True)
    bw_bytes = (256 if args.quick else 512) * 2**20 * (8 if dev.type == "cuda" else 1)  # >> a GPU's L2
    bw = read_copy_bandwidth(dev, bw_bytes)
    print(f"measured bandwidth: read {bw['read'] / 1e9:.1f} GB/s, copy {bw['copy'] / 1e9:.1f} GB/s "
          f"(the roofline below uses the best read rate of this run)", flush=True)
    ceiling = bw["read"]
    results: dict = {"device": info.name, "threads": info.torch_threads, "bandwidth": bw, "load_average": load,
                     "new_tokens": new_tokens, "prompt_len": args.prompt_len, "rows": []}
    for name in args.presets.split(","):
        if name == "tiny" and (TINY_DIR / "model.safetensors").is_file():
            model, label = load_tiny(device=dev).to(dtype), "tiny (trained)"
        else:
            model, label = Transformer.from_preset(name, dtype=dtype, device=dev), f"{name} (random)"
        # Re-measured next to each model: on a shared machine the measurement moves. The
        # ceiling is the best read rate seen in this run (a low reading is the machine
        # being busy, not a lower ceiling, and would flatter the roofline share).
        bw_now = read_copy_bandwidth(dev, bw_bytes)
        results.setdefault("bandwidth_per_preset", {})[name] = bw_now
        ceiling = max(ceiling, bw_now["read"])
        results["read_ceiling"] = ceiling
        print(f"-- {label}: {model.num_params() / 1e6:.1f} M params, "
              f"{model.weight_bytes_per_step() / 1e6:.1f} MB weights read per step; "
              f"read bandwidth now {bw_now['read'] / 1e9:.1f} GB/s, ceiling (best this run) "
              f"{ceiling / 1e9:.1f} GB/s", flush=True)
        # What a deployment does at load time: time the linear layers' layouts and forms
        # at these batch sizes on this machine and keep the fastest.
        tuned = model.tune_matmul(batches)
        results.setdefault("matmul", {})[name] = {k: tuned[k] for k in ("layout", "forms", "splits")}
        print(f"   matmul chosen by measurement: layout {tuned['layout']}, form per batch "
              + ", ".join(f"b{b} {f}" for b, f in tuned["forms"].items())
              + (f" (split: K in {tuned['splits']} blocks, one per thread)"
                 if "split" in tuned["forms"].values() else ""), flush=True)
        rows = bench_model(name, model, batches=batches, prompt_len=args.prompt_len,
                           new_tokens=new_tokens, repeat=repeat, bw=ceiling,
                           compile_=args.compile and name in args.compile_presets.split(","))
        # the per-matrix ceiling: its median over every round timed beside the decodes
        per_matrix = statistics.median([x for r in rows for x in r["matrix_read_rounds"]])
        results["rows"] += rows
        results.setdefault("matrix_read", {})[name] = per_matrix
        print(f"   its weight matrices read one after another (a sum each): {per_matrix / 1e9:.1f} GB/s = "
              f"{100 * per_matrix / ceiling:.0f}% of the one-tensor ceiling"
              # above 100%: the matrices fit in this CPU's cache and are not read from DRAM
              + (" (they fit in cache)" if per_matrix > ceiling else "") + "; labkit reaches "
              + ", ".join(f"b{r['batch']} {100 * r['labkit_matrix_roofline']:.0f}%" for r in rows)
              + f" of that (median over {repeat} rounds of the share, each round timing the decode and the "
              "reads back to back)", flush=True)
        if args.layouts and name == "small":
            rows = linear_layouts(model, repeat=10 if args.quick else 20)
            results["layouts"] = rows
            print("   linear layouts (weight GB/s; N x K, M rows):")
            for r in rows:
                print(f"     {r['N']:>6}x{r['K']:<5} M={r['M']}  {r['layout']:<14} {r['s'] * 1e3:7.3f} ms "
                      f"{r['GB_s']:6.1f} GB/s")
        if args.profile:
            for b in batches:
                print(f"   profile of labkit decode, {name}, batch {b}:")
                print(profile_decode(model, b))
        del model
    if args.cache_demo:
        model = (load_tiny(device=dev) if (TINY_DIR / "model.safetensors").is_file()
                 else Transformer.from_preset("tiny", device=dev)).to(dtype)
        n = 128 if args.quick else args.cache_demo_tokens
        d = cache_demo(model, new_tokens=n)
        results["cache_demo"] = d
        print(f"-- KV cache demo (tiny, {n} new tokens): cache {d['cache_s']:.2f} s, "
              f"no cache {d['nocache_s']:.2f} s, speed-up {d['speedup']:.1f}x, "
              f"identical tokens: {d['identical']}")
    return results


if __name__ == "__main__":
    raise SystemExit(main())
