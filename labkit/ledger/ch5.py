"""Chapter 5's claims: batching (C15), mixed traffic (C16), KV memory (C17), result caches (C18).

C15 times decode steps of the real engine on the memory-bound model of C10 (batch 1 vs 8),
then static vs continuous batching on the real server at 60 % of static's measured capacity. C16 drives the
real engine in process (no HTTP) with interactive requests at a rate the interactive class
alone fits, interleaved with a stream of offline jobs (~95 % load together), FIFO vs priority. C17 measures the tensor
storage of the KV cache `generate` allocates as sequences and lengths grow (model dtype and
int8) and fits it against the calculator's bytes per token, and counts the sequences the
engine fits (paged vs max-length reservation, int8 vs the model dtype).
C18 picks a cosine threshold on the labelled pairs, then serves a trace with repeats (the
held-out pairs) through the tiny model with and without the semantic cache: model calls and
mean latency removed, with hit precision as the guard.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from labkit import presets
from labkit.device import threads
from labkit.ledger.verdict import Prediction, Verdict, decide, inconclusive, settle
from labkit.loadgen import experiments as lx
from labkit.model import Transformer, load_tiny
from labkit.model.kv_memory import kv_bytes_per_token
from labkit.serve import experiments as sx
from labkit.serve import kv_capacity as kb

# C15: a batch-B decode step must give >= AMORTISE x the predicted tokens-per-step gain;
# continuous must cut static's p99 E2E by >= P99_GAIN x at >= KEEP x its throughput, and the
# shortest quarter of requests must wait >= P99_GAIN x less.
AMORTISE, P99_GAIN, KEEP = 0.5, 1.2, 0.95
C15_TOLERANCE = (f"gain >= {AMORTISE:g}x predicted; p99 and short-request ratios >= {P99_GAIN:g}x; "
                 f"throughput >= {KEEP:g}x")
# C16: FIFO "hurts" = interactive p99 TTFT >= HURT x the interactive class alone; priority
# "fixes" = removes >= FIX of that excess.
HURT, FIX = 2.0, 0.75
C16_TOLERANCE = f"FIFO >= {HURT:g}x alone; priority removes >= {100 * FIX:.0f}% of FIFO's excess"
# C17: linear = R^2 >= R2 and every point within DEV of the fit, slope within DEV of the
# model's bytes per token (block rounding is the allowed slack); "fit more" = >= MORE x.
R2, DEV, MORE = 0.99, 0.15, 1.2
# C18: hit precision on held-out non-identical pairs.
PRECISION = 0.99


# ------------------------------------------------------------------------------- C15
def predict_c15(weight_bytes: float, kv_bytes_per_token: float, context: int, batch: int) -> Prediction:
    """Memory-bound decode reads the weights once per step plus each sequence's KV: tokens per
    step at batch B vs 1 gain B (W + c kv) / (W + B c kv)."""
    gain = batch * (weight_bytes + context * kv_bytes_per_token) / (weight_bytes + batch * context * kv_bytes_per_token)
    return Prediction.of("C15", f"a batch-{batch} decode step yields ~{gain:.1f}x the tokens of batch 1 (weights read "
                                "once); continuous batching beats static on p99 E2E, short requests most",
                         **{"predicted gain": (gain, "x"), "weights": (weight_bytes / 2**20, "MiB"),
                            "KV per token": (kv_bytes_per_token, "B")})


def judge_c15(prediction: Prediction, step_1_s: float, step_b_s: float, batch: int, static: dict, continuous: dict,
              short_static_s: float, short_continuous_s: float) -> Verdict:
    """Measured decode step times (s) at batch 1 and `batch`; static and continuous summaries
    ("throughput_rps", "e2e" {"p99"} in s) of one trace; mean E2E (s) of its shortest quarter."""
    gain = batch * step_1_s / step_b_s
    want = AMORTISE * prediction.values["predicted gain"].value
    p99 = static["e2e"]["p99"] / continuous["e2e"]["p99"]
    tput = continuous["throughput_rps"] / static["throughput_rps"]
    short = short_static_s / short_continuous_s
    ev = {"tokens/step gain": (gain, "x"), "p99 E2E static/continuous": (p99, "x"),
          "throughput continuous/static": (tput, "x"), "short-quarter E2E static/continuous": (short, "x")}
    problems = [m for ok, m in ((gain >= want, f"batch {batch} gave only {gain:.1f}x the tokens per step"),
                                (p99 >= P99_GAIN, f"continuous cut static's p99 by only {p99:.2f}x"),
                                (tput >= KEEP, f"continuous carried {tput:.2f}x static's throughput"),
                                (short >= P99_GAIN, f"short requests waited only {short:.2f}x longer under static"))
                if not ok]
    return settle(prediction, problems,
                  why_holds=f"batch {batch} amortised the weight reads ({gain:.1f}x tokens/step); static held short "
                            f"requests {short:.1f}x longer and continuous cut p99 E2E {p99:.1f}x",
                  evidence=ev, tolerance=C15_TOLERANCE)


def run_c15(size: str = "smoke", device: Any = None) -> Verdict:
    """Tokens per step at batch 1 vs 8 on the real engine with the memory-bound model of C10
    (weights past the cache), then static vs continuous batching on the real server at 60 %
    of static's measured capacity (smoke: 80 chat requests, full: 300)."""
    Q = presets.sizes("quantization", size, device or "cpu")
    model = Transformer.from_preset(Q["c10_preset"], **Q["c10_overrides"])
    pred = predict_c15(model.num_params() * model.dtype.itemsize, kv_bytes_per_token(model.config, model.dtype),
                       64, 8)
    steps = sx.engine_step_times(model, (1, 8), prompt=64)  # on all threads, like C1's batch cost
    m = lx.c15_server(presets.sizes("ledger", size)["c15_requests"], device=getattr(device, "type", "cpu"))
    return judge_c15(pred, steps[1], steps[8], 8, m["static"], m["continuous"], m["short_static"],
                     m["short_continuous"])


# ------------------------------------------------------------------------------- C16
def predict_c16(capacity_rps: float, interactive_rps: float, backlog: int, offline_out: float, max_batch: int,
                interactive_out: int, offline_rps: float | None = None) -> Prediction:
    """From the measured capacity: one step ~ max_batch / (capacity x interactive_out) s.

    `offline_rps` None: a backlog of `backlog` offline jobs at t = 0; FIFO makes an interactive
    request wait for the backlog ahead to be admitted. `offline_rps` given: offline jobs
    arrive as a stream; the slots are busy a share rho = (interactive + offline work) /
    capacity of the time and FIFO adds a queueing wait ~ rho / (1 - rho) x the mean residual
    slot time / max_batch (M/G/1 heavy traffic spread over the slots). Priority: an
    interactive request waits for one slot to turn over."""
    step = max_batch / (capacity_rps * interactive_out)
    prio = offline_out / max_batch * step
    if offline_rps is None:
        fifo = (backlog - max_batch) / max_batch * offline_out * step
        how = "behind a FIFO backlog"
        extra: dict[str, Any] = {}
    else:
        work = interactive_rps + offline_rps * offline_out / interactive_out  # in interactive requests/s
        rho = min(work / capacity_rps, 0.99)
        mix = (interactive_rps * interactive_out ** 2 + offline_rps * offline_out ** 2) / \
            (interactive_rps * interactive_out + offline_rps * offline_out)  # E[S^2] / E[S], tokens
        fifo = rho / (1 - rho) * mix / 2 * step / max_batch
        how = f"with an offline stream ({100 * work / capacity_rps:.0f}% of capacity in all) in one FIFO queue"
        extra = {"offered load": (100 * work / capacity_rps, "%")}
    return Prediction.of("C16", f"interactive load {interactive_rps / capacity_rps:.0%} of capacity fits alone; "
                                f"{how} it waits ~{fifo:.2g} s, with priority ~{prio:.2g} s",
                         **{"capacity": (capacity_rps, "req/s"), "interactive": (interactive_rps, "req/s"),
                            **extra, "FIFO wait": (fifo, "s"), "priority wait": (prio, "s")})


def judge_c16(prediction: Prediction, alone_p99_s: float, fifo_p99_s: float, priority_p99_s: float,
              offline_done_fifo: int = 0, offline_done_priority: int = 0) -> Verdict:
    """Interactive p99 TTFT (s): the class alone, mixed under FIFO, mixed under priority."""
    hurt = fifo_p99_s / alone_p99_s
    removed = (fifo_p99_s - priority_p99_s) / (fifo_p99_s - alone_p99_s) if fifo_p99_s > alone_p99_s else 0.0
    ev = {"p99 TTFT alone": (alone_p99_s, "s"), "p99 TTFT FIFO": (fifo_p99_s, "s"),
          "p99 TTFT priority": (priority_p99_s, "s"), "FIFO / alone": (hurt, "x"),
          "excess removed by priority": (100 * removed, "%"),
          "offline done (FIFO, priority)": (f"{offline_done_fifo}, {offline_done_priority}", "")}
    problems = [m for ok, m in ((hurt >= HURT, f"FIFO raised interactive p99 TTFT only {hurt:.2f}x"),
                                (removed >= FIX, f"priority removed only {100 * removed:.0f}% of the excess"))
                if not ok]
    return settle(prediction, problems,
                  why_holds=f"one FIFO queue made interactive p99 TTFT {hurt:.1f}x its alone value; priority "
                            f"removed {100 * removed:.0f}% of that",
                  evidence=ev, tolerance=C16_TOLERANCE)


def run_c16(size: str = "smoke", device: Any = None) -> Verdict:
    with threads(1):  # the engine's steps on one thread; the caller's setting comes back after
        model = load_tiny()
        n = presets.sizes("ledger", size)["c16_interactive"]
        cap = sx.engine_capacity(model)
        pred = predict_c16(cap, sx.INTERACTIVE_LOAD * cap, 0, sx.OFFLINE_OUT, 8, sx.INTERACTIVE_OUT, sx.offline_rate(cap))
        m = sx.measure_c16(model, cap, interactive=n)
    return judge_c16(pred, m["alone"], m["fifo"], m["priority"], m["offline_done_fifo"], m["offline_done_priority"])


# ------------------------------------------------------------------------------- C17

def linear_fit(tokens: Sequence[float], nbytes: Sequence[float]) -> dict[str, float]:
    """Least-squares bytes = slope x tokens + intercept; R^2, and the largest deviation of a
    point's bytes per token from the slope (linear growth through zero: no hidden per-request
    or fixed part; block rounding is what remains)."""
    x, y = np.asarray(tokens, float), np.asarray(nbytes, float)
    slope, icpt = np.polyfit(x, y, 1)
    fit = slope * x + icpt
    r2 = 1 - float(np.sum((y - fit) ** 2)) / float(np.sum((y - y.mean()) ** 2))
    return {"slope": float(slope), "intercept": float(icpt), "r2": r2, "max_dev": float(np.max(np.abs(y / x / slope - 1)))}


def predict_c17(bytes_per_token: int, int8_bytes_per_token: int, paged_conc: float, maxlen_conc: float) -> Prediction:
    return Prediction.of("C17", f"KV bytes = {bytes_per_token} B x tokens x sequences; paged blocks fit "
                                f"~{paged_conc / max(maxlen_conc, 1):.1f}x, int8 ~{bytes_per_token / int8_bytes_per_token:.1f}x "
                                "the sequences", **{"bytes/token": (bytes_per_token, "B"),
                                                    "int8 bytes/token": (int8_bytes_per_token, "B"),
                                                    "paged conc.": (paged_conc, "seqs"),
                                                    "max-len conc.": (maxlen_conc, "seqs")})


def judge_c17(prediction: Prediction, growth: Sequence[tuple[int, int, int]], paged_peak: int, maxlen_peak: int,
              int8_peak: int | None = None, model_peak: int | None = None,
              int8_growth: Sequence[tuple[int, int, int]] | None = None) -> Verdict:
    """`growth`: (batch, tokens per sequence, bytes allocated) measured (`measure_kv_growth`);
    peak running sequences at one budget: paged vs max-length reservation, int8 vs model-dtype
    KV (None: not measured); `int8_growth`: the same growth with an int8 cache (optional), its
    slope judged against the calculator's int8 bytes per token."""
    fit = linear_fit([b * t for b, t, _ in growth], [n for *_, n in growth])
    want = prediction.values["bytes/token"].value
    slope_dev = fit["slope"] / want - 1
    paging = paged_peak / max(maxlen_peak, 1)
    ev: dict[str, Any] = {"fitted slope": (fit["slope"], "B/token"), "calculator": (want, "B/token"),
                          "R^2": (fit["r2"], ""), "max deviation from fit": (100 * fit["max_dev"], "%"),
                          "paged / max-len sequences": (paging, "x")}
    problems = []
    if fit["r2"] < R2 or fit["max_dev"] > DEV:
        problems.append(f"KV bytes are not linear in tokens (R^2 {fit['r2']:.3f}, worst {100 * fit['max_dev']:.0f}%)")
    if abs(slope_dev) > DEV:
        problems.append(f"slope {fit['slope']:.0f} B/token is {100 * slope_dev:+.0f}% off the model's {want:.0f}")
    if int8_growth:
        fit8 = linear_fit([b * t for b, t, _ in int8_growth], [n for *_, n in int8_growth])
        want8 = prediction.values["int8 bytes/token"].value
        ev["int8 fitted slope"] = (fit8["slope"], "B/token")
        if abs(fit8["slope"] / want8 - 1) > DEV or fit8["r2"] < R2:
            problems.append(f"the int8 cache took {fit8['slope']:.0f} B/token (R^2 {fit8['r2']:.3f}), not the "
                            f"calculator's {want8:.0f}")
    if paging < MORE:
        problems.append(f"paged blocks fit only {paging:.2f}x the sequences")
    if int8_peak is not None and model_peak:
        ev["int8 / model-dtype sequences"] = (int8_peak / model_peak, "x")
        if int8_peak / model_peak < MORE:
            problems.append(f"int8 KV fit only {int8_peak / model_peak:.2f}x the sequences")
    return settle(prediction, problems,
                  why_holds=f"allocated KV grew linearly ({fit['slope']:.0f} B/token, R^2 {fit['r2']:.4f}); paged "
                            f"blocks fit {paging:.1f}x the sequences" +
                            (f", int8 {int8_peak / model_peak:.1f}x" if int8_peak is not None and model_peak else ""),
                  evidence=ev,
                  tolerance=f"R^2 >= {R2}, points and slope within {100 * DEV:.0f}% (block rounding); "
                            f">= {MORE:g}x the sequences")


def c17_setup(size: str = "smoke") -> tuple[Prediction, dict[str, Any]]:
    """The prediction (from the model's shape and the workload's lengths) and what to measure."""
    P = presets.sizes("kv_cache", size)
    model = load_tiny()
    per, per8 = kv_bytes_per_token(model.config, model.dtype), kv_bytes_per_token(model.config, "int8")
    wl = kb.mixed_workload(P["engine_requests"], P["prompt_median"], P["output_median"], P["engine_max_len"])
    wl8 = kb.mixed_workload(P["int8_requests"], P["prompt_median"], P["output_median"], P["engine_max_len"])
    pred = predict_c17(per, per8, kb.predict(wl, P["engine_budget_tokens"], 16, "on_demand")["max_concurrency"],
                       kb.predict(wl, P["engine_budget_tokens"], 16, "max_len")["max_concurrency"])
    return pred, {"model": model, "wl": wl, "wl8": wl8, "budget": P["engine_budget_tokens"] * per}


def run_c17(size: str = "smoke", device: Any = None) -> Verdict:
    with threads(1):  # the caller's thread count comes back after
        pred, setup = c17_setup(size)
        m = sx.c17_measure(setup)
    return judge_c17(pred, m["growth"], m["paged"], m["max_len"], m["int8"], m["model"], m["int8_growth"])


# ------------------------------------------------------------------------------- C18

def predict_c18(m: dict[str, Any]) -> Prediction:
    """The threshold chosen on the labelled pairs (before the held-out pairs are scored)."""
    if m["threshold"] is None:
        return Prediction.of("C18", f"no threshold keeps >= 99% precision on non-identical labelled pairs "
                                    f"({m['encoder']})", encoder=(m["encoder"], ""))
    return Prediction.of("C18", f"threshold {m['threshold']:.3f} ({m['variant']}, {m['encoder']}) reuses "
                                f"{m['train_hit_rate']:.0%} of non-identical paraphrases at >= 99% precision; on "
                                "a trace with repeats it should answer about that share of them without a model "
                                "call, cutting the mean latency, and serve no wrong answer",
                         threshold=(m["threshold"], ""), **{"labelled hit rate": (100 * m["train_hit_rate"], "%")})


# C18: "removes repeated work": the cache answers >= REMOVE of the trace's repeats, and the
# mean latency falls by >= LATENCY_KEEP of what those skipped model calls would save if a
# lookup were free (the embedding and search must not eat most of the saving).
REMOVE, LATENCY_KEEP = 0.5, 0.5


def judge_c18(prediction: Prediction, threshold: float | None, held_true: int, held_false: int,
              held_same: int, trace: dict[str, Any] | None = None) -> Verdict:
    """Hits on held-out NON-IDENTICAL pairs at the chosen `threshold` (None: none was found):
    right (`held_true`, of `held_same` same-meaning pairs) and wrong (`held_false`): the
    precision guard. `trace`: `measure_c18_trace`'s counts and mean latencies (s), the work
    removed; without it the verdict is inconclusive (precision alone is not the claim)."""
    tol = (f"the cache answers >= {100 * REMOVE:.0f}% of the trace's repeats; mean latency falls by >= "
           f"{100 * LATENCY_KEEP:.0f}% of what the skipped calls would save; hit precision (held-out pairs and the "
           f"trace) >= {100 * PRECISION:.0f}%")
    if threshold is None:
        return decide(prediction, False, why_holds="", why_not="does not hold at any threshold here: no threshold "
                      "keeps 99% precision on non-identical labelled pairs", evidence={}, tolerance=tol)
    hits = held_true + held_false
    prec = held_true / hits if hits else float("nan")
    ev: dict[str, Any] = {"threshold": (threshold, ""), "held-out precision": (100 * prec, "%"),
                          "held-out false hits": (held_false, "")}
    if held_same == 0:
        return inconclusive(prediction, "the held-out set has no non-identical same-meaning pairs", ev, tol)
    if trace is None:
        return inconclusive(prediction, "the work removed was not measured (no trace served): held-out precision "
                                        "alone does not say whether the cache removes repeated work", ev, tol)
    n, calls = trace["requests"], trace["model_calls"]
    t_hits = trace["right_hits"] + trace["wrong_hits"]
    removed = trace["right_hits"] / max(trace["repeats"], 1)
    saved = 1 - trace["cached_mean_s"] / trace["base_mean_s"]
    free = (n - calls) / n  # the saving if a hit cost nothing and every call cost the mean
    t_prec = trace["right_hits"] / t_hits if t_hits else float("nan")
    ev.update({"model calls (no cache, cache)": (f"{n}, {calls}", ""), "repeats answered": (100 * removed, "%"),
               "mean latency (no cache, cache)": (f"{1e3 * trace['base_mean_s']:.1f}, "
                                                  f"{1e3 * trace['cached_mean_s']:.1f}", "ms"),
               "mean latency saved": (100 * saved, "%"), "trace hit precision": (100 * t_prec, "%")})
    problems = []
    if removed < REMOVE:
        problems.append(f"the cache answered only {100 * removed:.0f}% of the {trace['repeats']} repeats")
    if saved < LATENCY_KEEP * free:
        problems.append(f"mean latency fell only {100 * saved:.0f}% for {100 * free:.0f}% fewer model calls: the "
                        "lookup ate the saving")
    if (hits and prec < PRECISION) or (t_hits and t_prec < PRECISION):
        problems.append(f"it removed work by serving wrong answers: {held_false} false hits on held-out pairs, "
                        f"{trace['wrong_hits']} in the trace")
    return settle(prediction, problems,
                  why_holds=f"the cache answered {100 * removed:.0f}% of the repeats: {n - calls} of {n} model calls "
                            f"and {100 * saved:.0f}% of the mean latency removed, with no wrong answer served",
                  evidence=ev, tolerance=tol)


def run_c18(size: str = "smoke", device: Any = None) -> Verdict:
    from labkit.serve.embed import load_encoder

    enc = load_encoder("auto", "cpu")
    chosen = sx.choose_c18(enc, PRECISION)
    pred = predict_c18(chosen)
    m = sx.heldout_c18(enc, chosen)
    return judge_c18(pred, chosen["threshold"], m["held_true"], m["held_false"], m["held_same"],
                     sx.trace_c18(enc, chosen, size))
