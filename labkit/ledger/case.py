"""Chapter 6's method (C21) and case (C22), on the real server (`labkit.loadgen.case`).

C22: with the pre-processing stage unsafe for concurrent use (one global lock), p99 E2E at
an operating rate below the knee is several times the unloaded p99 (the article: ~5x),
and the code fix alone (no quantization) brings it within the SLO. C21: the method, walked
in order, finds that cause: the span breakdown puts the tail in one stage, the telemetry
shows the machine far from its compute and bandwidth ceilings, the profiler shows the
threads waiting, and the fix ladder stops at the first rung that meets the SLO.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from labkit.ledger.verdict import Prediction, Verdict, decide, distance_from_range, inconclusive

RATIO = 3.0          # C22: unsafe p99 / fixed p99 >= RATIO ("~5x": the order of magnitude, at least 3x)
ARTICLE_RATIO = 5.0
TAIL_SHARE = 0.5     # C21 step 1: the stage holds >= half of the tail requests' E2E
SATURATED = 0.85     # C21 step 2: server CPU at or above this share of the cores = compute-bound
BW_CEILING = 0.5     # ... or the model's weight reads at or above this share of the bandwidth
LOCK_SHARE = 0.25    # C21 step 3: >= this share of the busy thread samples wait at the stage's lock
RATIO_OWN_TAIL = 1.5  # C22, explaining a miss: a fixed p99 >= 1.5x the unloaded one is a tail of its own


# ------------------------------------------------------------------------------- C22
def predict_c22(unloaded_p99_s: float, rate_rps: float, serial_rps: float, capacity_rps: float,
                slo_s: float) -> Prediction:
    """Before loading: at `rate_rps` (below `serial_rps`, what one request at a time sustains,
    and far below `capacity_rps`, what the cores allow), requests that run side by side should
    keep p99 near the unloaded p99."""
    return Prediction.of("C22", f"at {rate_rps:.3g} req/s ({100 * rate_rps / serial_rps:.0f}% of the "
                                f"{serial_rps:.3g} req/s one request at a time sustains, "
                                f"{100 * rate_rps / capacity_rps:.0f}% of the {capacity_rps:.3g} req/s the cores "
                                f"allow) p99 E2E should stay near the unloaded "
                                f"{unloaded_p99_s:.3g} s, within the SLO; the article: an unsafe stage pushes it to "
                                f"~{ARTICLE_RATIO:g}x, and fixing the stage alone restores it",
                         **{"unloaded p99": (unloaded_p99_s, "s"), "SLO": (slo_s, "s"),
                            "operating rate": (rate_rps, "req/s"), "one at a time": (serial_rps, "req/s"),
                            "predicted capacity": (capacity_rps, "req/s")})


def judge_c22(prediction: Prediction, unloaded_p99_s: float, unsafe_p99_s: float, fixed_p99_s: float,
              unsafe_mean_s: float, fixed_mean_s: float, slo_s: float, fixed_cpu_util: float = 0.0,
              quantized: bool = False) -> Verdict:
    """p99 and mean E2E (s) with the stage unsafe and fixed, same rate, and unloaded;
    `fixed_cpu_util`: how busy the machine's cores were during the fixed run (0-1). A fix that lets
    stages run side by side needs cores to run them on: when the fixed run already filled the
    machine, this machine cannot tell (inconclusive)."""
    ev: dict[str, Any] = {"unloaded p99": (unloaded_p99_s, "s"), "unsafe p99": (unsafe_p99_s, "s"),
                          "fixed p99": (fixed_p99_s, "s"), "SLO": (slo_s, "s")}
    tol = (f"unsafe p99 >= {RATIO:g}x fixed p99 at the same rate (the article: ~{ARTICLE_RATIO:g}x), and the fix "
           "alone, no quantization, meets the SLO")
    if not all(map(math.isfinite, (unloaded_p99_s, unsafe_p99_s, fixed_p99_s, unsafe_mean_s, fixed_mean_s))):
        return inconclusive(prediction, "a run completed no request, so a p99 is missing", ev, tol)
    ratio, vs_normal = unsafe_p99_s / fixed_p99_s, unsafe_p99_s / unloaded_p99_s
    ev.update({"p99 unsafe / fixed": (ratio, "x"), "p99 unsafe / unloaded": (vs_normal, "x"),
               "mean unsafe / fixed": (unsafe_mean_s / fixed_mean_s, "x"),
               "outside ~5x (read as 3-8x)": (distance_from_range(ratio, RATIO, 8.0), "x"),
               "machine CPU during the fixed run": (100 * fixed_cpu_util, "%")})
    if fixed_cpu_util >= SATURATED and ratio < RATIO:
        return inconclusive(prediction, f"during the fixed run the cores were {100 * fixed_cpu_util:.0f}% busy "
                                        "(server and load generator): there is no spare core for stages to run side by side on, so this "
                                        "machine cannot show what the lock costs (more cores, or a lighter model, can)",
                            ev, tol)
    problems = []
    own_tail = fixed_p99_s / unloaded_p99_s
    ev["p99 fixed / unloaded"] = (own_tail, "x")
    if ratio < RATIO:
        why = (f"the unsafe stage raised p99 only {ratio:.2f}x over the fixed one (needs >= {RATIO:g}x): it did "
               f"reach {vs_normal:.1f}x the unloaded p99")
        if own_tail >= RATIO_OWN_TAIL:
            why += (f", but the fixed stage keeps a tail of its own, {own_tail:.1f}x the unloaded p99: requests "
                    "that arrive together share too few cores, so on this machine removing the lock cannot bring "
                    "the tail down to normal")
        else:
            why += ", and requests did not block each other enough to dominate the tail"
        problems.append(why)
    if fixed_p99_s > slo_s:
        problems.append(f"the fixed stage's p99 {fixed_p99_s:.3g} s still misses the {slo_s:.3g} s SLO")
    if quantized:
        problems.append("the configuration that met the SLO used quantization")
    return decide(prediction, not problems,
                  why_holds=f"requests waited for each other at the stage's lock: p99 {vs_normal:.1f}x the unloaded "
                            f"value, {ratio:.1f}x the fixed stage's (mean only {unsafe_mean_s / fixed_mean_s:.1f}x); the "
                            "code fix met the SLO with no quantization",
                  why_not="; ".join(problems), evidence=ev, tolerance=tol)


# ------------------------------------------------------------------------------- C21
def predict_c21(slo_s: float) -> Prediction:
    return Prediction.of("C21", "timing the request path puts the tail in one stage; telemetry shows compute and "
                                "bandwidth far from their ceilings; a profile shows why; the cheapest rung of the "
                                "fix ladder that meets the SLO is found before compression",
                         **{"SLO": (slo_s, "s")})


def judge_c21(prediction: Prediction, tail_spans: dict[str, float], cpu_util: float, bw_util: float,
              lock_share: float, ladder: Sequence[dict[str, Any]], slo_missed: bool = True) -> Verdict:
    """`tail_spans`: mean spans (s) of the slowest requests, with "e2e"; `cpu_util`: server CPU
    as a share of the cores (0-1); `bw_util`: the model's weight reads as a share of the
    measured bandwidth (0-1, NaN if unmeasured); `lock_share`: share of busy thread samples at
    the stage's lock (0-1, NaN without a profile); `ladder`: rows of `labkit.loadgen.case.climb`;
    `slo_missed`: did the service as shipped miss the SLO (if not, there was nothing to find)."""
    stages = {k: tail_spans.get(k, 0.0) for k in ("preprocess", "queue", "prefill", "decode", "post", "other", "wire")}
    worst = max(stages, key=stages.get)
    e2e = tail_spans.get("e2e", math.nan)
    share = stages[worst] / e2e if e2e and math.isfinite(e2e) else math.nan
    met = [r for r in ladder if r.get("met")]
    ev: dict[str, Any] = {"slowest span of the tail": (worst, ""), "its share of tail E2E": (100 * share, "%"),
                          "server CPU / cores": (100 * cpu_util, "%"), "weight reads / bandwidth": (100 * bw_util, "%"),
                          "samples at the stage's lock": (100 * lock_share, "%"),
                          "rung that met the SLO": (met[0]["cost"] if met else "none", "")}
    tol = (f"step 1: one span >= {100 * TAIL_SHARE:.0f}% of tail E2E; step 2: CPU < {100 * SATURATED:.0f}% of cores and "
           f"weight reads < {100 * BW_CEILING:.0f}% of bandwidth; step 3: >= {100 * LOCK_SHARE:.0f}% of busy samples at "
           "that stage's lock; the ladder: a rung before compression meets the SLO")
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
    if not met:
        problems.append("no rung before compression met the SLO")
    return decide(prediction, not problems,
                  why_holds=f"each step pointed at the same place: {worst} held {100 * share:.0f}% of the tail, the cores "
                            f"were {100 * cpu_util:.0f}% busy, {100 * lock_share:.0f}% of busy samples waited at its lock, "
                            f"and the cheapest sufficient rung was the {met[0]['cost'] if met else '-'}",
                  why_not="; ".join(problems), evidence=ev, tolerance=tol)


# ------------------------------------------------------------------------------- runs
def _walk(size: str) -> dict[str, Any]:
    """The whole case on the real server: baseline, unsafe at rate (profiled), the ladder, and
    the fixed stage at the same rate (the ladder's code-fix run, or one of its own when an
    earlier rung met the SLO)."""
    from labkit import presets
    from labkit.loadgen import case

    P = presets.sizes("case", size)
    sc = case.Scenario(requests=P["requests"], unloaded_requests=P["unloaded_requests"])
    with case.serve("global_lock") as srv:
        base = case.unloaded(srv, sc)
        slo = sc.slo_factor * base.p99
        rate = sc.load * base.serial_rps
        unsafe = case.at_rate(srv, rate, sc, profile_s=P["profile_s"])
    ladder = case.climb(rate, sc, slo, {"preprocess": "global_lock"}, progress=None)
    fixed = next((r["run"] for r in ladder if r.get("cost") == "code fix" and "run" in r), None)
    if fixed is None:
        with case.serve("per_thread") as srv:
            fixed = case.at_rate(srv, rate, sc)
    return {"scenario": sc, "base": base, "slo": slo, "rate": rate, "unsafe": unsafe, "ladder": ladder, "fixed": fixed}


_CACHE: dict[str, dict[str, Any]] = {}


def walked(size: str) -> dict[str, Any]:
    """The case walked once per size (`_walk`): it serves both claims in a `labkit ledger` run
    and `labkit.loadgen.case_bench`."""
    if size not in _CACHE:
        _CACHE[size] = _walk(size)
    return _CACHE[size]


def run_c22(size: str = "smoke", device: Any = None) -> Verdict:
    w = walked(size)
    pred = predict_c22(w["base"].p99, w["rate"], w["base"].serial_rps, w["base"].capacity_rps, w["slo"])
    fixed = w["fixed"]
    return judge_c22(pred, w["base"].p99, w["unsafe"].p99(), fixed.p99(), w["unsafe"].mean(), fixed.mean(), w["slo"],
                     fixed.machine_util)


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
