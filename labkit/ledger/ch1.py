"""Chapter 1's claims: prefill vs decode (C1) and the request path outside the model (C2).

C1 times prefill and decode of a random-initialised decoder whose weights are several
times the last-level cache (`labkit.phases`) against ceilings measured in the same run
(one square GEMM, STREAM). The analytic intensities only make the prediction; the verdict
comes from four measured signatures: prefill turns tokens over far faster than decode
(parallel), prefill runs at a large share of the measured matmul peak (compute-heavy),
batch-1 decode reads its bytes at a large share of the measured bandwidth, and a batch of
B sequences costs far less than B single steps (memory-bound: the weights are read once).

C2 times every span of the request path (`labkit.pipeline`) for the paths of chapter 1 and
tests the typical path's share outside the model against the article's 10-20 %.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from labkit import bench, phases, pipeline, presets
from labkit import device as _device
from labkit.bench.dtypes import choose_dtypes
from labkit.ledger.verdict import Prediction, Verdict, distance_from_range, inconclusive, settle
from labkit.model import Transformer, load_tiny
from labkit.timing import Spans

# C1 tolerances. PARALLEL: a prompt token through prefill must cost <= 1/5 of a decode token
# (a serial prefill would cost about the same). COMPUTE_SHARE: "compute-heavy" = prefill at
# >= 25 % of the measured GEMM peak (a memory-bound step of this model would sit at
# intensity x bandwidth, far lower). MEMORY_SHARE: batch-1 decode reads >= 50 % of the
# measured bandwidth. AMORTISE: a batch-B step costs <= B/2 batch-1 steps (a compute-bound
# step would cost ~B).
PARALLEL, COMPUTE_SHARE, MEMORY_SHARE, AMORTISE = 5.0, 0.25, 0.5, 0.5
C1_TOLERANCE = (f"prefill/decode tokens/s >= {PARALLEL:g}x; prefill >= {100 * COMPUTE_SHARE:.0f}% of peak; "
                f"decode >= {100 * MEMORY_SHARE:.0f}% of bandwidth; batch-B step <= {AMORTISE:g} B x batch-1")
C2_RANGE = (10.0, 20.0)  # the article's pre+post share of end-to-end latency, %
TYPICAL, HEAVY = "typical (light RAG, top-p)", "heavy RAG"  # the paths of `pipeline.standard_configs`


# ------------------------------------------------------------------------------- C1
def predict_c1(roof: Any, prefill_analytic: Mapping[str, float], decode_analytic: Mapping[str, float],
               prompt_len: int, dtype: str = "fp32") -> Prediction:
    """From the model's shape (`phases.analytic` of a `prompt_len`-token prefill and a batch-1
    decode step) and this run's measured ceilings `roof` (a `labkit.roofline.Roofline`):
    prefill above the ridge (compute-bound), decode below it (memory-bound), and the
    per-token time ratio the roofline bounds give."""
    ridge = roof.ridge(dtype)
    pre_i, dec_i = prefill_analytic["intensity"], decode_analytic["intensity"]
    gain = (prompt_len / prefill_analytic["time_s"]) / (1 / decode_analytic["time_s"])
    return Prediction.of(
        "C1", f"prefill of {prompt_len} tokens at {pre_i:.0f} FLOP/B is {roof.bound(pre_i, dtype)}-bound, "
              f"batch-1 decode at {dec_i:.2f} FLOP/B is {roof.bound(dec_i, dtype)}-bound (ridge {ridge:.1f} "
              f"FLOP/B); prefill should turn tokens over ~{gain:.0f}x faster",
        **{"ridge": (ridge, "FLOP/B"), "prefill intensity": (pre_i, "FLOP/B"),
           "decode intensity": (dec_i, "FLOP/B"), "peak": (roof.peak(dtype), "FLOP/s"),
           "bandwidth": (roof.bandwidth, "B/s"), "predicted per-token gain": (gain, "x")})


def judge_c1(prediction: Prediction, prefill: Sequence[Mapping[str, float]],
             decode: Sequence[Mapping[str, float]]) -> Verdict:
    """C1 from timings: `prefill` rows of `phases.time_prefill` (the longest prompt is judged)
    and `decode` rows of `phases.time_decode` (batch 1 and the largest batch, both at the
    shortest context). Shares are of the measured peak (FLOP/s) and bandwidth (B/s) that
    the prediction carries."""
    if not prefill or not decode:
        raise ValueError(f"need prefill and decode rows, got {len(prefill)} and {len(decode)}")
    peak, bw = prediction.values["peak"].value, prediction.values["bandwidth"].value
    p = max(prefill, key=lambda r: r["prompt_len"])
    ctx = min(r["context"] for r in decode)
    at_ctx = sorted((r for r in decode if r["context"] == ctx), key=lambda r: r["batch"])
    d1, dB = at_ctx[0], at_ctx[-1]
    gain = p["tokens_per_s"] / d1["tokens_per_s"]
    compute = p["flop_per_s"] / peak
    memory = d1["bytes_per_s"] / bw
    ev: dict[str, Any] = {"prefill / decode tokens/s": (gain, "x"), "prefill share of peak": (100 * compute, "%"),
                          "decode share of bandwidth": (100 * memory, "%")}
    checks = [(gain >= PARALLEL, f"prefill turned tokens over only {gain:.1f}x faster than decode"),
              (compute >= COMPUTE_SHARE, f"prefill ran at only {100 * compute:.0f}% of the measured peak"),
              (memory >= MEMORY_SHARE, f"batch-1 decode read only {100 * memory:.0f}% of the measured bandwidth "
                                       "(per-step overhead or a busy machine took the rest)")]
    amortised = ""
    if dB["batch"] > d1["batch"]:
        batch = dB["batch"] / d1["batch"]
        cost = dB["s_per_step"] / d1["s_per_step"]
        ev[f"batch-{dB['batch']} step / batch-{d1['batch']} step"] = (cost, "x")
        checks.append((cost <= AMORTISE * batch, f"a batch-{dB['batch']} step cost {cost:.1f}x a batch-"
                                                 f"{d1['batch']} step: the weight read was not shared"))
        amortised = f" and a batch of {dB['batch']} cost {cost:.1f}x one step"
    problems = [msg for ok, msg in checks if not ok]
    return settle(prediction, problems,
                  why_holds=f"prefill ran {gain:.0f}x faster per token at {100 * compute:.0f}% of the peak; batch-1 "
                            f"decode read {100 * memory:.0f}% of the bandwidth{amortised}",
                  evidence=ev, tolerance=C1_TOLERANCE)


def run_c1(size: str = "smoke", device: Any = None) -> Verdict:
    """C1 end to end with chapter 1's sizes (`presets` "prefill_decode"), each phase in the
    dtype this machine runs fastest (`choose_dtypes`), as notebook 01 does."""
    dev = _device.pick(device or "auto")
    P = presets.sizes("prefill_decode", size, dev)
    dt = choose_dtypes(dev).dtypes()
    roof = phases.measure_rooflines(dev, dt.values())
    big = Transformer.from_preset(P["big_model"], dtype=bench.zoo.DTYPES[dt["prefill"]], device=dev,
                                  **P["big_overrides"])
    models = phases.phase_models(big, dt)
    T, ctx = max(P["prompt_lens"]), min(P["contexts"])
    pred = predict_c1(roof, phases.analytic(big.config, roof, "prefill", seq_len=T, dtype=dt["prefill"]),
                      phases.analytic(big.config, roof, "decode", batch=1, context=ctx, dtype=dt["decode"]), T,
                      dt["prefill"])
    prefill = phases.time_prefill(models["prefill"], [T], roof, repeat=P["repeat"], dtype=dt["prefill"])
    decode = phases.time_decode(models["decode"], [1, max(P["batches"])], [ctx], roof, steps=P["decode_steps"],
                                repeat=P["repeat"], dtype=dt["decode"])
    return judge_c1(pred, prefill, decode)


# ------------------------------------------------------------------------------- C2
def predict_c2(typical: str = TYPICAL, heavy: str = HEAVY) -> Prediction:
    """The article's words: the typical path spends 10-20 % outside the model, heavy retrieval more."""
    lo, hi = C2_RANGE
    return Prediction.of("C2", f"the {typical} path spends {lo:.0f}-{hi:.0f}% of its time outside the model; "
                               f"{heavy} spends more", **{"range low": (lo, "%"), "range high": (hi, "%")})


def judge_c2(prediction: Prediction, shares: Mapping[str, Mapping[str, float]], typical: str = TYPICAL,
             heavy: str = HEAVY) -> Verdict:
    """C2 from `shares`: path name -> `pipeline.breakdown` ({"pre", "model", "post"} in %).
    Holds when the typical path's pre+post share is inside the claim's range and the heavy
    path's is larger; the evidence gives the distance from the range."""
    for name in (typical, heavy):
        if name not in shares:
            raise ValueError(f"no path {name!r} in shares; have: {', '.join(shares)}")
    lo, hi = C2_RANGE
    outside = {name: s["pre"] + s["post"] for name, s in shares.items()}
    t, h = outside[typical], outside[heavy]
    dist = distance_from_range(t, lo, hi)
    worst = max(outside, key=outside.get)
    ev = {f"{typical} outside the model": (t, "%"), "distance from 10-20 %": (dist, "points"),
          f"{heavy} outside the model": (h, "%"), f"worst ({worst})": (outside[worst], "%")}
    tol = f"typical inside [{lo:g}, {hi:g}] % (the claim's range); heavy > typical"
    if not all(0 <= v <= 100 for v in outside.values()):
        return inconclusive(prediction, "a share is outside 0-100 %: the spans were not timed", ev, tol)
    problems = []
    if dist:
        problems.append(f"the typical path spent {t:.1f}% outside the model, {abs(dist):.1f} points "
                        f"{'below' if dist < 0 else 'above'} the {lo:g}-{hi:g}% range")
    if h <= t:
        problems.append(f"heavy retrieval did not add to it ({h:.1f}% vs {t:.1f}%)")
    return settle(prediction, problems,
                  why_holds=f"the typical path spent {t:.1f}% outside the model and heavy retrieval {h:.1f}%: "
                            "time the whole request path first",
                  evidence=ev, tolerance=tol)


def measure_c2(model: Any, queries: Sequence[str], max_new_tokens: int, n_docs: int | None, *,
               warmup: int = 1, seed: int = 0) -> dict[str, Any]:
    """Serve `queries` through every standard request path (`pipeline.standard_configs`),
    interleaved query by query so that other work on the machine slows all paths alike
    (the claim compares their shares). Returns {path name: `pipeline.RequestPipeline`}, whose
    `.spans` hold this run's timings (s); `warmup` untimed requests per path first."""
    pipes = {name: pipeline.RequestPipeline(model, c, seed=seed)
             for name, c in pipeline.standard_configs(max_new_tokens, n_docs).items()}
    for pipe in pipes.values():
        for q in list(queries)[:warmup]:
            pipe(q)
        pipe.spans = Spans(device=model.device)
    for q in queries:
        for pipe in pipes.values():
            pipe(q)
    return pipes


def run_c2(size: str = "smoke", device: Any = None) -> Verdict:
    """C2 end to end with chapter 1's sizes, on the trained tiny model."""
    dev = _device.pick(device or "auto")
    P = presets.sizes("prefill_decode", size, dev)
    pred = predict_c2()
    paths = measure_c2(load_tiny(dev), pipeline.SAMPLE_QUERIES[: P["requests"]], P["max_new_tokens"], P["n_docs"])
    return judge_c2(pred, {name: pipeline.breakdown(p.spans) for name, p in paths.items()})
