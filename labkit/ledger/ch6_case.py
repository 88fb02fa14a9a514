"""Chapter 6's method (C21) and case (C22), on the real server (`labkit.loadgen.case`).

C22: with the pre-processing stage unsafe for concurrent use (one store client behind a global
lock held across the store's answer), p99 E2E at a modest rate is about 5x normal (read as
3-8x the fixed service's p99 at the same rate), the code fix alone brings it within the SLO,
and the planned quantization, with the bug still in place, does not. C21: the method, walked
in order, finds that cause: the span breakdown puts the tail in one stage, the telemetry
shows the machine far from its compute and bandwidth ceilings, the profiler shows the
threads waiting, and the fix ladder stops at the first rung that meets the SLO.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from labkit.ledger.verdict import Prediction, Verdict, distance_from_range, inconclusive, settle

BAND = (3.0, 8.0)    # C22: "~5x normal" read as 3-8x the fixed service's p99 at the same rate
ARTICLE_RATIO = 5.0
TAIL_SHARE = 0.5     # C21 step 1: the stage holds >= half of the tail requests' E2E
SATURATED = 0.85     # C21 step 2: server CPU at or above this share of the cores = compute-bound
BW_CEILING = 0.5     # ... or the model's weight reads at or above this share of the bandwidth
LOCK_SHARE = 0.25    # C21 step 3: >= this share of the busy thread samples wait at the stage's lock
RATIO_OWN_TAIL = 1.5  # C22, explaining a miss: a fixed p99 >= 1.5x the unloaded one is a tail of its own


# ------------------------------------------------------------------------------- C22
def md1_p99_sojourn(load: float, requests: int, seed: int = 0, trials: int = 200) -> float:
    """Median over `trials` runs of `requests` Poisson arrivals of the p99 time through a
    one-server queue with a constant service time (M/D/1, Lindley's recursion), in units of
    that service time, at utilisation `load`. What a lock held for a fixed time per request
    adds to the tail of a run of this length (short runs see less of the tail than theory's
    stationary p99)."""
    from labkit.loadgen.case import lock_sojourn

    if not 0 < load < 1:
        raise ValueError(f"load must lie in (0, 1), got {load!r}")
    gaps = np.random.default_rng(seed).exponential(1 / load, (trials, requests))
    return float(np.median(np.percentile(lock_sojourn(gaps, 1.0), 99, axis=1)))


def predict_c22(unloaded_p99_s: float, rate_rps: float, capacity_rps: float, store_delay_s: float,
                lock_load: float, requests: int, slo_s: float, lock_tail: Any = None) -> Prediction:
    """Before loading: the shipped stage holds its lock for the store's answer (`store_delay_s`)
    at `lock_load` utilisation, a one-server queue with a constant service time. Its p99 time
    at the lock, in hold times, for the arrival sequence the runs will replay
    (`lock_tail.this_run`, a `labkit.loadgen.case.LockTail`; without one, M/D/1's median over
    random sequences, `md1_p99_sojourn`), added to the rest of a request, predicts the unsafe
    p99, while a stage whose requests run side by side should keep p99 near the unloaded one."""
    x = lock_tail.this_run if lock_tail is not None else md1_p99_sojourn(lock_load, requests)
    unsafe = x * store_delay_s + max(0.0, unloaded_p99_s - store_delay_s)
    source = (f"this run's planned arrivals put p99 at {x:.1f}x the hold time (random sequences of {requests}: "
              f"median {lock_tail.median:.1f}x, p10-p90 {lock_tail.p10:.1f}-{lock_tail.p90:.1f}x)"
              if lock_tail is not None else f"M/D/1 over {requests} requests puts p99 at ~{x:.1f}x the hold time")
    return Prediction.of("C22", f"at {rate_rps:.3g} req/s ({100 * rate_rps / capacity_rps:.0f}% of the fixed service's "
                                f"capacity) requests that run side by side keep p99 near the unloaded "
                                f"{unloaded_p99_s:.3g} s; a lock held {1e3 * store_delay_s:.0f} ms per request at "
                                f"{100 * lock_load:.0f}% utilisation queues them: {source}, so ~{unsafe:.3g} s, "
                                f"{unsafe / unloaded_p99_s:.1f}x normal (the article: ~{ARTICLE_RATIO:g}x); the fix "
                                "alone restores the SLO, quantization does not",
                         **{"unloaded p99": (unloaded_p99_s, "s"), "SLO": (slo_s, "s"),
                            "operating rate": (rate_rps, "req/s"), "fixed capacity": (capacity_rps, "req/s"),
                            "store delay": (1e3 * store_delay_s, "ms"), "lock utilisation": (100 * lock_load, "%"),
                            "p99 at the lock": (x, "hold times"), "predicted unsafe p99": (unsafe, "s")})


def judge_c22(prediction: Prediction, unloaded_p99_s: float, unsafe_p99_s: float, fixed_p99_s: float,
              quantized_p99_s: float, slo_s: float, unsafe_mean_s: float = math.nan,
              fixed_mean_s: float = math.nan, fixed_cpu_util: float = 0.0) -> Verdict:
    """p99 E2E (s) of the shipped (unsafe) stage, the fixed stage and the shipped stage with int8
    weights, all at the same rate, and unloaded; `fixed_cpu_util`: how busy the machine's cores
    were during the fixed run (0-1). Holds when unsafe p99 is BAND x the fixed p99 ("~5x
    normal"), the fixed p99 meets the SLO and the quantized one does not. A fix that lets
    stages overlap needs cores for their own work: when the fixed run already filled the
    machine and the ratio is short, this machine cannot tell (inconclusive)."""
    lo, hi = BAND
    ev: dict[str, Any] = {"unloaded p99": (unloaded_p99_s, "s"), "unsafe p99": (unsafe_p99_s, "s"),
                          "fixed p99": (fixed_p99_s, "s"), "int8 with the bug p99": (quantized_p99_s, "s"),
                          "SLO": (slo_s, "s")}
    tol = (f"unsafe p99 / fixed p99 at the same rate in {lo:g}-{hi:g}x (the article: ~{ARTICLE_RATIO:g}x normal); "
           "the fix alone meets the SLO; int8 weights with the bug still in place do not")
    if not all(map(math.isfinite, (unloaded_p99_s, unsafe_p99_s, fixed_p99_s, quantized_p99_s))):
        return inconclusive(prediction, "a run completed no request, so a p99 is missing", ev, tol)
    ratio, vs_normal, own_tail = unsafe_p99_s / fixed_p99_s, unsafe_p99_s / unloaded_p99_s, fixed_p99_s / unloaded_p99_s
    ev.update({"p99 unsafe / fixed": (ratio, "x"), "p99 unsafe / unloaded": (vs_normal, "x"),
               "p99 fixed / unloaded": (own_tail, "x"), f"outside {lo:g}-{hi:g}x": (distance_from_range(ratio, lo, hi), "x"),
               "machine CPU during the fixed run": (100 * fixed_cpu_util, "%")})
    if math.isfinite(unsafe_mean_s) and math.isfinite(fixed_mean_s):
        ev["mean unsafe / fixed"] = (unsafe_mean_s / fixed_mean_s, "x")
    if fixed_cpu_util >= SATURATED and ratio < lo:
        return inconclusive(prediction, f"during the fixed run the cores were {100 * fixed_cpu_util:.0f}% busy "
                                        "(server and load generator): requests of the fixed service queue for cores "
                                        "too, so this machine cannot show what the lock alone costs", ev, tol)
    problems = []
    if ratio < lo:
        why = f"the unsafe stage raised p99 only {ratio:.2f}x over the fixed one (needs >= {lo:g}x)"
        if own_tail >= RATIO_OWN_TAIL:
            why += (f": the fixed stage keeps a tail of its own, {own_tail:.1f}x the unloaded p99, so requests "
                    "queue for the cores whether or not they queue at the lock")
        problems.append(why)
    elif ratio > hi:
        problems.append(f"the unsafe stage raised p99 {ratio:.1f}x over the fixed one, far past ~{ARTICLE_RATIO:g}x: "
                        "the lock is close to saturation at this rate, a different regime from the article's")
    if fixed_p99_s > slo_s:
        problems.append(f"the fixed stage's p99 {fixed_p99_s:.3g} s still misses the {slo_s:.3g} s SLO")
    if quantized_p99_s <= slo_s:
        problems.append(f"int8 weights with the bug still in place met the SLO (p99 {quantized_p99_s:.3g} s): here the "
                        "quantization project would have been enough")
    return settle(prediction, problems,
                  why_holds=f"requests waited for each other at the stage's lock: p99 {ratio:.1f}x the fixed stage's at "
                            f"the same rate ({vs_normal:.1f}x unloaded); the code fix met the SLO, int8 weights with the "
                            f"bug did not (p99 {quantized_p99_s / unsafe_p99_s:.2f}x the unsafe one)",
                  evidence=ev, tolerance=tol)


# ------------------------------------------------------------------------------- C21
def predict_c21(slo_s: float) -> Prediction:
    return Prediction.of("C21", "timing the request path puts the tail in one stage; telemetry shows compute and "
                                "bandwidth far from their ceilings; a profile shows why; ordered by measured cost "
                                "(answers changed, then effort), the first rung of the fix ladder that meets the SLO "
                                "keeps every answer",
                         **{"SLO": (slo_s, "s")})


def judge_c21(prediction: Prediction, tail_spans: dict[str, float], cpu_util: float, bw_util: float,
              lock_share: float, ladder: Sequence[dict[str, Any]], slo_missed: bool = True) -> Verdict:
    """`tail_spans`: mean spans (s) of the slowest requests, with "e2e"; `cpu_util`: server CPU
    as a share of the cores (0-1); `bw_util`: the model's weight reads as a share of the
    measured bandwidth (0-1, NaN if unmeasured); `lock_share`: share of busy thread samples at
    the stage's lock (0-1, NaN without a profile); `ladder`: rows of `labkit.loadgen.case.climb`,
    in cost order, with "met" and "answers_changed" (0-1, the share of the shipped service's
    answers the rung changed); `slo_missed`: did the service as shipped miss the SLO (if not,
    there was nothing to find)."""
    stages = {k: tail_spans.get(k, 0.0) for k in ("preprocess", "queue", "prefill", "decode", "post", "other", "wire")}
    worst = max(stages, key=stages.get)
    e2e = tail_spans.get("e2e", math.nan)
    share = stages[worst] / e2e if e2e and math.isfinite(e2e) else math.nan
    met = [r for r in ladder if r.get("met")]
    chosen = met[0] if met else None
    changed = chosen.get("answers_changed", math.nan) if chosen else math.nan
    ev: dict[str, Any] = {"slowest span of the tail": (worst, ""), "its share of tail E2E": (100 * share, "%"),
                          "server CPU / cores": (100 * cpu_util, "%"), "weight reads / bandwidth": (100 * bw_util, "%"),
                          "samples at the stage's lock": (100 * lock_share, "%"),
                          "first rung by cost to meet the SLO": (chosen["cost"] if chosen else "none", ""),
                          "answers it changed": (100 * changed, "%"),
                          "ladder by cost": (" > ".join(r["cost"] for r in ladder if "skipped" not in r), "")}
    tol = (f"step 1: one span >= {100 * TAIL_SHARE:.0f}% of tail E2E; step 2: CPU < {100 * SATURATED:.0f}% of cores and "
           f"weight reads < {100 * BW_CEILING:.0f}% of bandwidth; step 3: >= {100 * LOCK_SHARE:.0f}% of busy samples at "
           "that stage's lock; the ladder, ordered by measured cost: the first rung to meet the SLO changes no answer")
    if not slo_missed:
        return inconclusive(prediction, "the service as shipped already met the SLO at this rate: there was no "
                                        "problem for the method to find", ev, tol)
    if not math.isfinite(share):
        return inconclusive(prediction, "no completed request carried spans", ev, tol)
    if not math.isfinite(lock_share):
        return inconclusive(prediction, "the profiler took no samples of busy threads", ev, tol)
    problems = []
    if share < TAIL_SHARE:
        problems.append(f"the tail is spread over the path (the largest span, {worst}, holds {100 * share:.0f}%)")
    if cpu_util >= SATURATED or (math.isfinite(bw_util) and bw_util >= BW_CEILING):
        problems.append(f"the machine is near a ceiling (CPU {100 * cpu_util:.0f}%, weight reads "
                        f"{100 * bw_util:.0f}% of bandwidth): this tail is capacity, not a blocked stage")
    if worst == "preprocess" and lock_share < LOCK_SHARE:
        problems.append(f"the profile shows only {100 * lock_share:.0f}% of samples at the stage's lock")
    if worst != "preprocess":
        problems.append(f"the spans point at {worst}, not at the pre-processing stage the profile blames")
    if chosen is None:
        problems.append("no rung of the ladder met the SLO")
    elif not changed == 0:
        problems.append(f"the first rung to meet the SLO, {chosen['cost']}, changed {100 * changed:.0f}% of the answers: "
                        "no fix that keeps the service's output was found")
    return settle(prediction, problems,
                  why_holds=f"each step pointed at the same place: {worst} held {100 * share:.0f}% of the tail, the cores "
                            f"were {100 * cpu_util:.0f}% busy, {100 * lock_share:.0f}% of busy samples waited at its lock, "
                            f"and the cheapest sufficient rung, changing no answer, was the "
                            f"{chosen['cost'] if chosen else '-'}",
                  evidence=ev, tolerance=tol)


# ------------------------------------------------------------------------------- runs
_CACHE: dict[str, dict[str, Any]] = {}


def walked(size: str) -> dict[str, Any]:
    """The case walked once per size (`labkit.loadgen.case.walk`): it serves both claims in a
    `labkit ledger` run and `labkit.benches.case_study`."""
    from labkit.loadgen import case

    if size not in _CACHE:
        _CACHE[size] = case.walk(size)
    return _CACHE[size]


def c22_prediction(w: dict[str, Any]) -> Prediction:
    """C22's prediction from a walked case (`walked`)."""
    from labkit.loadgen.case import lock_tail

    pt, sc = w["point"], w["scenario"]
    return predict_c22(w["base"].p99, pt.rate_rps, pt.capacity_rps, pt.store_delay_s, pt.lock_load, sc.requests,
                       w["slo"], lock_tail(sc))


def run_c22(size: str = "smoke", device: Any = None) -> Verdict:
    w = walked(size)
    fixed, unsafe = w["fixed"], w["unsafe"]
    return judge_c22(c22_prediction(w), w["base"].p99, unsafe.p99(), fixed.p99(), w["quantized"].p99(), w["slo"],
                     unsafe.mean(), fixed.mean(), fixed.machine_util)


def run_c21(size: str = "smoke", device: Any = None) -> Verdict:
    from labkit.loadgen import case

    w = walked(size)
    pred = predict_c21(w["slo"])
    spans = case.span_breakdown(w["unsafe"].result.measured)
    return judge_c21(pred, spans.get("tail", {}), w["unsafe"].cpu_util, model_bw_util(w["unsafe"]),
                     case.lock_share(w["unsafe"].stacks), w["ladder"], w["unsafe"].p99() > w["slo"])


def model_bw_util(run: Any) -> float:
    """The engine's weight reads during `run` as a share of this machine's read bandwidth."""
    from labkit.bench.suites import read_copy_bandwidth
    from labkit.loadgen import case
    from labkit.model import load_tiny

    weights = sum(p.numel() * p.element_size() for p in load_tiny().parameters())
    return case.model_bandwidth_util(run, weights, read_copy_bandwidth(nbytes=64 * 2**20, repeat=3)["read"])
