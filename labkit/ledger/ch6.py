"""Chapter 6's claims: the mean hides the tail (C19), and a load sweep finds the knee (C20).

Both run on the real server (`labkit serve` + the load generator) in notebook 08 and in
`labkit ledger` at every size. The simulator whose step costs were fitted on this machine
(`labkit.loadgen.experiments.calibrated_cost`) only predicts; where the server cannot start, its
numbers are judged and the verdict says "inconclusive (simulated)", never "holds".
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from labkit import presets
from labkit.knee import first_past
from labkit.ledger.verdict import Prediction, Verdict, decide, inconclusive, settle, simulated
from labkit.loadgen import experiments as lx

# C19: "a 30 % better mean can come with a 5 % better p99". The larger of the two relative
# changes must reach MOVE (the configurations really differ), and the two must move
# differently: |Δmean − Δp99| >= SPREAD x the larger, i.e. in the same direction the smaller
# is at most a third of the larger (the article's example is a sixth), or they move apart.
MOVE = 0.20
SPREAD = 2 / 3
# C20: the knee is the first level whose p99 E2E exceeds KNEE_FACTOR x the lightest level's.
KNEE_FACTOR = 2.0
TRACK_OPEN = 0.9     # below the knee an open loop's throughput keeps >= 90 % of the offered rate
TRACK_CLOSED = 0.6   # a closed loop's keeps >= 60 % of linear growth with users
AT_CAPACITY = 0.75   # "near capacity": throughput at the knee >= 75 % of the sweep's highest
PLATEAU = 1 / AT_CAPACITY  # and past the knee it rises by at most the same margin


# ------------------------------------------------------------------------------- C19
def predict_c19(tail_share: float, repeat_share: float, typical_output: int, tail_output: int,
                predicted: dict[str, float] | None = None) -> Prediction:
    """From the traffic's shape: E2E ~ output tokens, repeats (only among typical requests)
    become free, the tail (> 1 % of requests) holds the p99 and is never a hit. `predicted`
    (the calibrated twin's {mean, p99} changes), when given, is shown beside it."""
    typical = (1 - tail_share) * typical_output
    mean_change = -repeat_share * typical / (typical + tail_share * tail_output)
    vals: dict[str, Any] = {"mean change (shape)": (100 * mean_change, "%"), "p99 change (shape)": (0.0, "%")}
    if predicted:
        vals.update({"mean change (twin)": (100 * predicted["mean"], "%"),
                     "p99 change (twin)": (100 * predicted["p99"], "%")})
    return Prediction.of("C19", f"answering repeats from a cache moves the mean E2E by about "
                                f"{100 * mean_change:+.0f}% while the p99 (the {100 * tail_share:.0f}% long "
                                f"requests) barely moves", **vals)


def judge_c19(prediction: Prediction, mean_change: float, p99_change: float, p50_change: float | None = None,
              n: int | None = None) -> Verdict:
    """Relative changes (after / before − 1) of mean and p99 latency between two configurations."""
    big = max(abs(mean_change), abs(p99_change))
    evidence: dict[str, Any] = {"mean change": (100 * mean_change, "%"), "p99 change": (100 * p99_change, "%")}
    if p50_change is not None:
        evidence["p50 change"] = (100 * p50_change, "%")
    if n is not None:
        evidence["requests per run"] = (n, "")
    tol = (f"the larger change >= {100 * MOVE:.0f}% and |Δmean − Δp99| >= {SPREAD:.2f} x it (same direction: the "
           "smaller <= 1/3 of the larger; the article: 30% vs 5%)")
    if not all(map(math.isfinite, (mean_change, p99_change))):
        return inconclusive(prediction, "a latency change is not a number (a run completed no request)", evidence, tol)
    if big < MOVE:
        return inconclusive(prediction, f"neither the mean nor the p99 moved by {100 * MOVE:.0f}%: the two "
                                        "configurations do not differ enough to tell", evidence, tol)
    apart = abs(mean_change - p99_change) >= SPREAD * big
    mover = "mean" if abs(mean_change) >= abs(p99_change) else "p99"
    return decide(prediction, apart,
                  why_holds=f"the {mover} moved {100 * big:.0f}% while the other moved "
                            f"{100 * (p99_change if mover == 'mean' else mean_change):+.0f}%: one number does not "
                            "tell the other, so track p50/p95/p99",
                  why_not="mean and p99 moved together: here the mean did not hide the tail",
                  evidence=evidence, tolerance=tol)


# ------------------------------------------------------------------------------- C20
def predict_c20(capacity_rps: float, axis: str, levels: Sequence[float], source: str) -> Prediction:
    """Capacity (requests/s) from the calibrated cost model, before the sweep runs."""
    return Prediction.of("C20", f"below about {capacity_rps:.3g} req/s ({source}) throughput follows the load at "
                                f"flat latency; past it p99 climbs and throughput stops rising",
                         **{"predicted capacity": (capacity_rps, "req/s"),
                            f"{axis} levels": (f"{min(levels):.3g}-{max(levels):.3g}", "")})


def judge_c20(prediction: Prediction, rows: Sequence[dict[str, Any]], axis: str = "rate",
              factor: float = KNEE_FACTOR) -> Verdict:
    """`rows`: sweep summaries with `axis` ("rate": open loop, offered req/s; "concurrency":
    closed loop, users), "throughput_rps" and "e2e" {"p99"} (s)."""
    if axis not in ("rate", "concurrency"):
        raise ValueError(f"axis {axis!r} unknown; choose 'rate' or 'concurrency'")
    rows = sorted(rows, key=lambda r: r[axis])
    track = TRACK_OPEN if axis == "rate" else TRACK_CLOSED
    tol = (f"knee = first level with p99 E2E > {factor:g}x the lightest; >= 2 levels below it whose throughput keeps "
           f">= {100 * track:.0f}% of " + ("the offered rate" if axis == "rate" else "linear growth with users") +
           f"; throughput at the knee >= {100 * AT_CAPACITY:.0f}% of the sweep's highest and rising <= "
           f"{100 * (PLATEAU - 1):.0f}% past it")
    if len(rows) < 3:
        return inconclusive(prediction, f"a sweep of {len(rows)} levels cannot show a knee (need >= 3)", {}, tol)
    k = first_past(rows, axis, factor)
    base = rows[0]
    ev: dict[str, Any] = {"lightest p99 E2E": (base["e2e"]["p99"], "s"),
                          "capacity (highest throughput)": (max(r["throughput_rps"] for r in rows), "req/s")}
    if k is None:
        return inconclusive(prediction, f"no level's p99 exceeded {factor:g}x the lightest: the sweep never "
                                        f"reached capacity (extend it past {rows[-1][axis]:g})", ev, tol)
    i = rows.index(k)
    cap = max(r["throughput_rps"] for r in rows)
    below, after = rows[:i], rows[i + 1:]
    ev.update({f"knee {axis}": (k[axis], "req/s" if axis == "rate" else "users"),
               "throughput at knee": (k["throughput_rps"], "req/s"), "p99 E2E at knee": (k["e2e"]["p99"], "s"),
               "levels below knee": (len(below), "")})
    if not after:
        return inconclusive(prediction, "the knee is the sweep's last level: nothing shows the plateau past it",
                            ev, tol)

    def kept(r: dict) -> float:  # share of what the offered load (or linear growth) would give
        ideal = r["rate"] if axis == "rate" else base["throughput_rps"] * r[axis] / base[axis]
        return r["throughput_rps"] / ideal
    worst = min(kept(r) for r in below)
    rise = max(r["throughput_rps"] for r in after) / k["throughput_rps"]
    ev.update({"worst tracking below knee": (100 * worst, "%"), "throughput rise past knee": (100 * (rise - 1), "%"),
               "knee / highest throughput": (100 * k["throughput_rps"] / cap, "%")})
    problems = []
    if len(below) < 2:
        problems.append(f"p99 already passed {factor:g}x at the second level: latency climbs from the lightest load")
    if worst < track:
        problems.append(f"below the knee throughput fell to {100 * worst:.0f}% of the load")
    if k["throughput_rps"] < AT_CAPACITY * cap or rise > PLATEAU:
        problems.append(f"throughput keeps rising past the knee ({100 * (rise - 1):+.0f}%): the knee is not capacity")
    return settle(prediction, problems,
                  why_holds=f"up to {below[-1][axis]:g} throughput tracked the load at flat latency; at {k[axis]:g} "
                            f"p99 passed {factor:g}x and throughput sat at {k['throughput_rps']:.3g} req/s, the plateau",
                  evidence=ev, tolerance=tol)


# ------------------------------------------------------------------------------- runs

def run_c19(size: str = "smoke", device: Any = None) -> Verdict:
    """The real server at every size (no cache vs exact result cache; smoke: the preset's
    requests x 2, ~20 s a run). If the server cannot start here, the calibrated twin's numbers
    are judged and the verdict is labelled simulated (inconclusive)."""
    P = presets.sizes("serving", size)
    mix = lx.TailMix()
    specs = mix.specs(P["c19_requests"] * presets.sizes("ledger", size)["c19_repeat"], P["c19_rate"], 0)
    cost = lx.calibrated_cost()
    twin_pred = lx.predict_cache_effect(specs, lx.sim_server(), cost)
    pred = predict_c19(mix.tail_share, mix.repeat_share, mix.typical_output, mix.tail_output, twin_pred)
    try:
        ch = lx.c19_real(specs, getattr(device, "type", "cpu"))
    except (RuntimeError, TimeoutError, OSError) as exc:
        return simulated(judge_c19(pred, twin_pred["mean"], twin_pred["p99"], twin_pred["p50"], n=len(specs)),
                         f"the twin calibrated on this machine's step costs; the real server did not start: "
                         f"{type(exc).__name__}")
    return judge_c19(pred, ch["mean"], ch["p99"], ch["p50"], n=len(specs))


def run_c20(size: str = "smoke", device: Any = None) -> Verdict:
    """A closed-loop concurrency sweep of the real server at every size (the preset's users).
    If the server cannot start here, an open-loop rate sweep of the calibrated twin is judged
    and the verdict is labelled simulated (inconclusive)."""
    cost, twin = lx.calibrated_cost(), lx.sim_server()
    P = presets.sizes("serving", size)
    cap = lx.sim_capacity(cost, twin, P["sweep_len"], P["sweep_len"])  # the sweep's own requests
    pred = predict_c20(cap, "concurrency", P["sweep_users"], "the calibrated cost model")
    try:
        rows = lx.c20_real(P, getattr(device, "type", "cpu"))
    except (RuntimeError, TimeoutError, OSError) as exc:
        cap = lx.sim_capacity(cost, twin, lx.CHAT_PROMPT["mean"], lx.CHAT_OUTPUT["mean"])
        rates = list(np.geomspace(0.1, 3.0, 9) * cap)
        sim_pred = predict_c20(cap, "rate", rates, "the calibrated cost model")
        return simulated(judge_c20(sim_pred, lx.sim_rate_sweep(cost, twin, rates, 600, 0), "rate"),
                         f"an open-loop sweep of the twin calibrated on this machine; the real server did not "
                         f"start: {type(exc).__name__}")
    return judge_c20(pred, rows, "concurrency")
