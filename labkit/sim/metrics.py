"""Serving metrics with vLLM's benchmark definitions (`vllm bench serve`).

Per request: TTFT = first token − arrival; E2E = last token − arrival;
TPOT = (E2E − TTFT) / (output tokens − 1), for requests with > 1 output token;
queueing delay = first admitted − arrival. ITL = every gap between consecutive tokens
of a request (pooled over requests). Throughput over the run's duration (first arrival to
last completion): requests/s, output tokens/s, total (prompt + output) tokens/s.
Goodput = requests/s that met every SLO of their class. All times in s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labkit.sim.result import Result

QUANTILES = (50, 90, 95, 99)


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """`np.percentile(np.repeat(values, weights), q)` (linear), without building the repeat."""
    values, weights = np.asarray(values, float), np.asarray(weights, np.int64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if not len(values):
        return float("nan")
    order = np.argsort(values, kind="stable")
    v, c = values[order], np.cumsum(weights[order])
    rank = q / 100 * (c[-1] - 1)
    lo, hi = int(np.floor(rank)), int(np.ceil(rank))
    vlo, vhi = v[np.searchsorted(c, lo, side="right")], v[np.searchsorted(c, hi, side="right")]
    return float(vlo + (vhi - vlo) * (rank - lo))


def describe(x: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """mean, p50, p90, p95, p99 of samples `x` (optionally integer-weighted)."""
    x = np.asarray(x, float)
    if weights is None:
        weights = np.ones(len(x), np.int64)
    if not len(x) or weights.sum() == 0:
        return {"mean": float("nan"), **{f"p{q}": float("nan") for q in QUANTILES}}
    out = {"mean": float(np.average(x, weights=weights))}
    out.update({f"p{q}": weighted_percentile(x, weights, q) for q in QUANTILES})
    return out


def per_request(r: Result) -> dict[str, np.ndarray]:
    """Per-request arrays (NaN where undefined): ttft, tpot, e2e, queue (s)."""
    w = r.workload
    ttft = r.t_first - w.arrival
    e2e = r.t_done - w.arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(w.output > 1, (e2e - ttft) / (w.output - 1), np.nan)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e, "queue": r.t_sched - w.arrival}


def meets_slo(r: Result) -> np.ndarray:
    """Mask of completed requests that met every SLO of their class."""
    m = per_request(r)
    ok = r.done.copy()
    for i, c in enumerate(r.workload.classes):
        mine = r.workload.cls == i
        for key, slo in (("ttft", c.slo_ttft), ("tpot", c.slo_tpot), ("e2e", c.slo_e2e)):
            if slo is not None:
                ok &= ~mine | (np.nan_to_num(m[key], nan=0.0) <= slo)  # tpot NaN (1 token): no TPOT
    return ok


def summary(r: Result, cls: int | None = None) -> dict[str, Any]:
    """Every metric of the run (or of class index `cls`): latency stats, throughput, goodput,
    batch and KV figures. Latencies in s, rates per s."""
    w = r.workload
    mask = np.ones(len(w), bool) if cls is None else w.cls == cls
    done = mask & r.done
    m = per_request(r)
    start = float(w.arrival[mask].min()) if mask.any() else 0.0
    end = float(np.nanmax(r.t_done[done])) if done.any() else start
    duration = max(end - start, 1e-12)
    tl = r.timeline
    out: dict[str, Any] = {"requests": int(mask.sum()), "completed": int(done.sum()),
                           "rejected": sum(1 for i in r.rejected if mask[i]), "duration_s": duration}
    for key in ("ttft", "tpot", "e2e", "queue"):
        x = m[key][done]
        out[key] = describe(x[~np.isnan(x)])
    if cls is None:  # ITL is pooled over steps, so it is reported for the whole run
        out["itl"] = describe(np.concatenate([tl["dt"], r.extra_itl]),
                              np.concatenate([tl["decode"], np.ones(len(r.extra_itl), np.int64)]))
    out_tok, in_tok = int(w.output[done].sum()), int(w.prompt[done].sum())
    out["throughput_rps"] = done.sum() / duration
    out["output_tps"] = out_tok / duration
    out["total_tps"] = (out_tok + in_tok) / duration
    out["goodput_rps"] = (meets_slo(r) & done).sum() / duration
    out["preemptions"] = int(r.preemptions[mask].sum())
    out.update(timeline_stats(r))
    return out


def timeline_stats(r: Result) -> dict[str, float]:
    """Time-weighted mean batch size (running seqs), mean/max KV utilisation (blocks in use /
    total) and mean KV waste (share of in-use memory holding no token)."""
    tl = r.timeline
    if not len(tl["dt"]):
        return {"mean_batch": 0.0, "kv_util_mean": 0.0, "kv_util_max": 0.0, "kv_waste_mean": 0.0}
    dt = tl["dt"]
    reserved = tl["kv_blocks"] * r.kv_unit
    with np.errstate(invalid="ignore", divide="ignore"):
        waste = np.where(reserved > 0, 1 - tl["kv_tokens"] / reserved, 0.0)
    return {"mean_batch": float(np.average(tl["batch"], weights=dt)),
            "kv_util_mean": float(np.average(tl["kv_blocks"], weights=dt) / r.kv_total),
            "kv_util_max": float(tl["kv_blocks"].max() / r.kv_total),
            "kv_waste_mean": float(np.average(waste, weights=dt))}


def format_summary(s: dict[str, Any], title: str = "") -> str:
    """A compact text table of `summary` output (ms for latencies)."""
    lines = [title] if title else []
    lines.append(f"{'metric':<8}" + "".join(f"{k:>10}" for k in ("mean", "p50", "p90", "p95", "p99")))
    for key in ("ttft", "tpot", "itl", "e2e", "queue"):
        if key in s:
            lines.append(f"{key:<8}" + "".join(f"{1e3 * s[key][k]:>10.1f}" for k in ("mean", "p50", "p90", "p95", "p99")))
    lines.append(f"(ms)  completed {s['completed']}/{s['requests']}, rejected {s['rejected']}, "
                 f"{s['throughput_rps']:.2f} req/s, {s['output_tps']:.0f} out tok/s, "
                 f"goodput {s['goodput_rps']:.2f} req/s, mean batch {s['mean_batch']:.1f}, "
                 f"KV util {100 * s['kv_util_mean']:.0f}% (waste {100 * s['kv_waste_mean']:.0f}%)")
    return "\n".join(lines)
