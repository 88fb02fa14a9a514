"""Chapter 2's claims: compute vs bandwidth (C3), the roofline (C4), utilisation (C5).

C3 changes compute at fixed memory bandwidth on this machine (1 vs all CPU threads; on a
CUDA GPU fp32 vs TF32 tensor cores, same bytes) and compares the speed-up of a
compute-bound GEMM with that of a decode-like GEMV whose weight is several times the
last-level cache. The datasheet table (data/hardware.csv) is context in the notebook; it
never decides.

C4 sweeps a kernel of tunable intensity (`labkit.bench.experiments.intensity_sweep`: an
array past the cache streamed once through a matmul with a width x width matrix) across
the ridge, fits the two-segment roofline shape to the measured FLOP/s alone, and compares
the fitted knee with the ridge predicted from the separately measured ceilings.

C5 reads hardware counters (`labkit.bench.counters`: NVML GPM on NVIDIA, perf events on
Linux CPUs) while a GEMM and a GEMV loop; without counters the verdict is inconclusive.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

from labkit import bench, phases, presets
from labkit import device as _device
from labkit.bench import counters, run_kernel, zoo
from labkit.bench.counters import CounterReading
from labkit.bench.experiments import intensity_sweep
from labkit.ledger.verdict import Prediction, Verdict, decide, inconclusive, settle

# C3: the GEMM must gain >= MIN_COMPUTE_GAIN x from the knob, or compute did not change
# enough to test anything; "barely speeds up" = decode keeps <= PASS_ON of the GEMM's gain
# (gain = speed-up - 1): with bandwidth fixed, a memory-bound step should keep ~none of it.
MIN_COMPUTE_GAIN, PASS_ON = 1.5, 1 / 3
# C4: the fitted knee must sit within KNEE_TOL x of the predicted ridge. The ridge divides a
# square GEMM's peak by STREAM's bandwidth; the swept kernel's own plateau and streaming rate
# each land at ~50-100 % of those, so their ratio can move ~2x, and the 2x-spaced sweep adds
# ~1.4x: 3x. The same 3x bounds the fitted slope against the measured bandwidth and the
# plateau against the measured peak (the claim puts the curve on those ceilings, not just
# its bend at the right place). The points must follow the two-segment shape within FIT_RMS
# (log10 rms, ~1.4x).
KNEE_TOL, FIT_RMS = 3.0, 0.15
# C5: the claim's "< ~30 %" compute, and "high" bandwidth = at least half of the peak.
LOW_COMPUTE, HIGH_BANDWIDTH = 0.30, 0.50


def _sizes(size: str, dev: Any) -> dict[str, Any]:
    return presets.sizes("roofline", size, dev)


def gemv_shape(dev: Any, dtype: str, P: Mapping[str, Any]) -> dict[str, int]:
    """The zoo's decode-like GEMV (m = 1), its weight `llc_multiple` x the last-level cache."""
    return next(s for n, s in bench.zoo_shapes(dev, dtype, P["llc_multiple"], dict(P)) if n == "gemm" and s["m"] == 1)


def _intensity(shape: Mapping[str, int], dtype: str) -> float:
    k = zoo.get("gemm")
    return k.flops(**shape) / k.bytes(zoo.itemsize(dtype), **shape)


# ------------------------------------------------------------------------------- C3
def compute_knob(device: Any) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """How this device adds compute at fixed bandwidth: (description, low settings, high
    settings) for `run_kernel`, or None where it cannot (one CPU, MPS)."""
    if device.type == "cpu":
        n = os.cpu_count() or 1
        return (f"1 -> {n} threads", {"n_threads": 1}, {"n_threads": n}) if n >= 2 else None
    if device.type == "cuda":  # TF32 runs fp32 matmuls on tensor cores: more FLOP/s, the same bytes
        return "fp32 -> TF32 tensor cores", {"dtype": "fp32"}, {"dtype": "tf32"}
    return None


def predict_c3(knob: str, gemm: Mapping[str, int], gemv: Mapping[str, int], ridge: float,
               dtype: str = "fp32") -> Prediction:
    """From the shapes and this run's ridge (FLOP/B): the GEMM sits above the ridge and gains
    what the knob adds in compute; the GEMV sits far below it and gains ~nothing."""
    gi, vi = _intensity(gemm, dtype), _intensity(gemv, dtype)
    return Prediction.of("C3", f"{knob} adds compute, not bandwidth: the {gemm['m']}x{gemm['k']}x{gemm['n']} GEMM "
                               f"({gi:.0f} FLOP/B) speeds up with it, the decode GEMV ({vi:.2f} FLOP/B, below the "
                               f"{ridge:.1f} FLOP/B ridge) barely",
                         **{"GEMM intensity": (gi, "FLOP/B"), "GEMV intensity": (vi, "FLOP/B"),
                            "ridge": (ridge, "FLOP/B"), "decode speed-up": (1.0, "x")})


def c3_setup(device: Any, P: Mapping[str, Any]) -> dict[str, Any]:
    """What C3 runs on `device` with the chapter's sizes `P`: the knob (`compute_knob`: name,
    low and high settings; low/high None where there is none), the GEMM and GEMV shapes and
    the dtype (fp32 for the TF32 knob, which keeps fp32 storage on both sides)."""
    knob = compute_knob(device)
    dtype = "fp32" if device.type == "cuda" else bench.default_dtype(device)
    name, low, high = knob if knob else (f"more compute on {device.type}", None, None)
    return {"knob": name, "low": low, "high": high, "dtype": dtype,
            "gemm": {"m": P["c3_gemm"], "n": P["c3_gemm"], "k": P["c3_gemm"]}, "gemv": gemv_shape(device, dtype, P)}


def measure_c3(device: Any, setup: Mapping[str, Any], rounds: int = 3) -> dict[str, float] | None:
    """Best-of-`rounds` seconds of the GEMM and the GEMV at both knob settings of `setup`
    (`c3_setup`), interleaved so that other work on a shared machine hits both alike;
    speed-ups = low-compute time / high-compute time. None where there is no knob."""
    if setup["low"] is None:
        return None
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for label in ("low", "high"):
            kw = {"dtype": setup["dtype"], **setup[label]}
            for name, rep in (("gemm", 3), ("gemv", 5)):
                r = run_kernel("gemm", device=device, group="c3", warmup=1, repeat=rep, **kw, **setup[name])
                best[name, label] = min(best.get((name, label), math.inf), r.stats["min"])
    return {"gemm_speedup": best["gemm", "low"] / best["gemm", "high"],
            "decode_speedup": best["gemv", "low"] / best["gemv", "high"],
            "gemm_low_s": best["gemm", "low"], "gemm_high_s": best["gemm", "high"],
            "gemv_low_s": best["gemv", "low"], "gemv_high_s": best["gemv", "high"]}


def judge_c3(prediction: Prediction, measured: Mapping[str, float] | None, knob: str = "the knob") -> Verdict:
    """C3 from `measure_c3`'s speed-ups (low-compute time / high-compute time) of the GEMM
    ("gemm_speedup") and the GEMV ("decode_speedup"); None = no knob on this device."""
    tol = (f"GEMM >= {MIN_COMPUTE_GAIN:g}x (else compute did not change); decode keeps <= {100 * PASS_ON:.0f}% of the "
           "GEMM's gain")
    if measured is None:
        return inconclusive(prediction, f"no way to add compute at fixed bandwidth here ({knob}: one CPU thread, "
                                        "or a device without a TF32 switch)", tolerance=tol)
    gemm_speedup, decode_speedup = measured["gemm_speedup"], measured["decode_speedup"]
    kept = (decode_speedup - 1) / (gemm_speedup - 1) if gemm_speedup > 1 else math.nan
    ev = {"GEMM speed-up": (gemm_speedup, "x"), "decode (GEMV) speed-up": (decode_speedup, "x"),
          "share of the GEMM's gain decode kept": (100 * kept, "%")}
    if not gemm_speedup >= MIN_COMPUTE_GAIN:
        return inconclusive(prediction, f"{knob} gave the compute-bound GEMM only {gemm_speedup:.2f}x: compute did "
                                        "not change enough to test the claim (too few cores, or other work on "
                                        "this machine took the added ones)", ev, tol)
    return decide(prediction, kept <= PASS_ON,
                  why_holds=f"{knob} sped the GEMM up {gemm_speedup:.2f}x but decode only {decode_speedup:.2f}x: "
                            "the added compute did not reach the memory-bound step",
                  why_not=f"decode sped up {decode_speedup:.2f}x against the GEMM's {gemm_speedup:.2f}x: here "
                          f"{knob} also added bandwidth (e.g. one core cannot saturate this machine's memory)",
                  evidence=ev, tolerance=tol)


def run_c3(size: str = "smoke", device: Any = None) -> Verdict:
    """C3 end to end with chapter 2's sizes: the knob of `compute_knob`, prediction, timing, verdict."""
    dev = _device.pick(device or "auto")
    setup = c3_setup(dev, _sizes(size, dev))
    ridge = phases.measure_roofline(dev, setup["dtype"]).ridge(setup["dtype"]) if setup["low"] else math.nan
    pred = predict_c3(setup["knob"], setup["gemm"], setup["gemv"], ridge, setup["dtype"])
    return judge_c3(pred, measure_c3(dev, setup, rounds=presets.sizes("ledger", size)["c3_rounds"]), setup["knob"])


# ------------------------------------------------------------------------------- C4
def predict_c4(roof: Any, dtype: str = "fp32") -> Prediction:
    """The ridge (FLOP/B) = this run's measured peak (FLOP/s) / measured bandwidth (B/s)."""
    ridge = roof.ridge(dtype)
    return Prediction.of("C4", f"attained FLOP/s grows in proportion to intensity up to the ridge at {ridge:.1f} "
                               f"FLOP/B, then stays flat near the {roof.peak(dtype) / 1e9:.3g} GFLOP/s peak",
                         **{"ridge": (ridge, "FLOP/B"), "peak": (roof.peak(dtype), "FLOP/s"),
                            "bandwidth": (roof.bandwidth, "B/s")})


def sweep_widths(ridge: float, itemsize: int, lo: int = 4, hi: int = 8192) -> list[int]:
    """Powers of two from `lo` whose streamed-GEMM intensity (~ width / itemsize FLOP/B) spans
    ridge/8 .. 16 x ridge (FLOP/B), capped at `hi`: points well on both sides of the ridge."""
    if not (ridge > 0 and math.isfinite(ridge)):
        raise ValueError(f"ridge must be a positive number of FLOP/B, got {ridge!r}")
    widths, w = [], lo
    while w <= hi and w / itemsize <= 16 * ridge:
        if w / itemsize >= ridge / 8:
            widths.append(w)
        w *= 2
    return widths


def fit_roofline(intensity: Sequence[float], flop_per_s: Sequence[float]) -> dict[str, float]:
    """Least-squares fit (in log10) of min(plateau, bandwidth x I) to measured points, trying
    every split into a slope part and a flat part. Returns the fitted `bandwidth` (B/s),
    `plateau` (FLOP/s), `knee` = plateau / bandwidth (FLOP/B) and the `rms` log10 residual."""
    if len(intensity) != len(flop_per_s) or len(intensity) < 3:
        raise ValueError(f"need >= 3 (intensity, FLOP/s) pairs of equal length, got {len(intensity)} and "
                         f"{len(flop_per_s)}")
    if min(intensity) <= 0 or min(flop_per_s) <= 0:
        raise ValueError("intensities (FLOP/B) and rates (FLOP/s) must be > 0")
    pts = sorted(zip(map(math.log10, intensity), map(math.log10, flop_per_s)))
    best: dict[str, float] = {}
    for j in range(1, len(pts)):
        log_bw = sum(p - i for i, p in pts[:j]) / j
        log_top = sum(p for _, p in pts[j:]) / (len(pts) - j)
        sse = sum((p - min(log_top, i + log_bw)) ** 2 for i, p in pts)
        if not best or sse < best["sse"]:
            best = {"sse": sse, "bandwidth": 10 ** log_bw, "plateau": 10 ** log_top}
    best["knee"] = best["plateau"] / best["bandwidth"]
    best["rms"] = math.sqrt(best.pop("sse") / len(pts))
    return best


def judge_c4(prediction: Prediction, intensity: Sequence[float], flop_per_s: Sequence[float]) -> Verdict:
    """C4 from a measured sweep: intensities (FLOP/B, analytic FLOPs / minimal bytes of each
    kernel) and attained FLOP/s (analytic FLOPs / measured time). The knee comes from the data
    alone; the ridge from the prediction (separately measured ceilings)."""
    ridge = prediction.values["ridge"].value
    peak, bandwidth = prediction.values["peak"].value, prediction.values["bandwidth"].value
    tol = (f"knee within {KNEE_TOL:g}x of the ridge, fitted slope and plateau within {KNEE_TOL:g}x of the measured "
           f"bandwidth and peak; points within {10 ** FIT_RMS:.2f}x (rms) of the two-segment fit")
    ev: dict[str, Any] = {"points": (len(intensity), ""),
                          "intensity range": (f"{min(intensity, default=0):.3g}-{max(intensity, default=0):.3g}",
                                              "FLOP/B")}
    if len(intensity) < 4:
        return inconclusive(prediction, f"only {len(intensity)} points measured (need >= 4)", ev, tol)
    if not (min(intensity) <= ridge / 2 and max(intensity) >= 2 * ridge):
        return inconclusive(prediction, f"the sweep ({min(intensity):.3g}-{max(intensity):.3g} FLOP/B) does not reach "
                                        f"from ridge/2 to 2 x ridge ({ridge:.3g} FLOP/B)", ev, tol)
    fit = fit_roofline(intensity, flop_per_s)
    ratio = fit["knee"] / ridge
    ev.update({"measured knee": (fit["knee"], "FLOP/B"), "knee / ridge": (ratio, "x"),
               "fitted slope": (fit["bandwidth"], "B/s"), "fitted plateau": (fit["plateau"], "FLOP/s"),
               "scatter about the fit": (10 ** fit["rms"], "x")})
    problems = []
    if not 1 / KNEE_TOL <= ratio <= KNEE_TOL:
        problems.append(f"the measured knee ({fit['knee']:.3g} FLOP/B) is {max(ratio, 1 / ratio):.1f}x "
                        f"{'above' if ratio > 1 else 'below'} the predicted ridge ({ridge:.3g} FLOP/B)")
    for what, got, ceiling, unit in (("slope", fit["bandwidth"], bandwidth, "B/s"),
                                     ("plateau", fit["plateau"], peak, "FLOP/s")):
        if not 1 / KNEE_TOL <= got / ceiling <= KNEE_TOL:
            problems.append(f"the fitted {what} ({got:.3g} {unit}) is {100 * got / ceiling:.0f}% of the measured "
                            f"{'bandwidth' if what == 'slope' else 'peak'} ({ceiling:.3g} {unit})"
                            + (" (this kernel does not reach that ceiling here: its narrow matmuls may not "
                               "stream at full speed, or other work slowed the sweep)" if got < ceiling else
                               " (data served from a cache, not DRAM?)"))
    if fit["rms"] > FIT_RMS:
        problems.append(f"the points scatter {10 ** fit['rms']:.2f}x (rms) about the best two-segment fit: "
                        "not a slope-then-flat curve")
    return settle(prediction, problems,
                  why_holds=f"attained FLOP/s rose with intensity and flattened at {fit['knee']:.3g} FLOP/B, "
                            f"{ratio:.2f}x the predicted ridge",
                  evidence=ev, tolerance=tol)


def measure_c4(device: Any, ridge: float, nbytes: int, dtype: str = "fp32", repeat: int = 5,
               max_call_s: float = 0.5) -> list[Any]:
    """`intensity_sweep` over the widths `sweep_widths` picks for `ridge` (FLOP/B), best of `repeat`
    calls per width (a ceiling-like rate, as the ridge's own peak and bandwidth are)."""
    return intensity_sweep(device, sweep_widths(ridge, zoo.itemsize(dtype)), nbytes=nbytes, dtype=dtype,
                           repeat=repeat, max_call_s=max_call_s)


def run_c4(size: str = "smoke", device: Any = None) -> Verdict:
    """C4 end to end: ceilings measured now, the ridge predicted, the intensity sweep, the verdict."""
    dev = _device.pick(device or "auto")
    P, dtype = _sizes(size, dev), bench.default_dtype(dev)
    roof = phases.measure_roofline(dev, dtype)
    pred = predict_c4(roof, dtype)
    rows = measure_c4(dev, roof.ridge(dtype), bench.dram_bytes(dev, P["llc_multiple"]), dtype,
                      max_call_s=P["max_call_s"] * 2)
    return judge_c4(pred, [r.intensity for r in rows], [r.best_flop_per_s for r in rows])


# ------------------------------------------------------------------------------- C5
def predict_c5(roof: Any, gemm: Mapping[str, int], gemv: Mapping[str, int], dtype: str = "fp32") -> Prediction:
    """From the roofline (analytic intensity, measured ceilings): the share of peak FLOP/s each
    kernel can reach at best. Only the counters judge."""
    out = {}
    for name, shape in (("GEMV", gemv), ("GEMM", gemm)):
        i = _intensity(shape, dtype)
        out[name] = (i, roof.attainable(i, dtype) / roof.peak(dtype))
    return Prediction.of("C5", f"the GEMV ({out['GEMV'][0]:.2f} FLOP/B) is memory-bound: counters should show "
                               f"compute < {100 * LOW_COMPUTE:.0f}% and bandwidth >= {100 * HIGH_BANDWIDTH:.0f}%; "
                               f"the GEMM ({out['GEMM'][0]:.0f} FLOP/B) should not show that signature",
                         **{"GEMV compute at best": (100 * out["GEMV"][1], "%"),
                            "GEMM compute at best": (100 * out["GEMM"][1], "%")})


def _signature(r: CounterReading) -> bool:
    return r.compute_util < LOW_COMPUTE and r.bandwidth_util >= HIGH_BANDWIDTH


def judge_c5(prediction: Prediction, readings: Mapping[str, CounterReading] | str) -> Verdict:
    """C5 from counter readings {"GEMV": r, "GEMM": r}, or the reason (str) none exist here.
    Holds when the memory-bound GEMV shows low compute with high bandwidth utilisation and the
    compute-bound GEMM does not: the signature then tells the two apart."""
    tol = f"memory-bound signature = compute < {100 * LOW_COMPUTE:.0f}% and bandwidth >= {100 * HIGH_BANDWIDTH:.0f}%"
    if isinstance(readings, str):
        return inconclusive(prediction, f"no hardware counters on this machine: {readings}", tolerance=tol)
    missing = {"GEMV", "GEMM"} - set(readings)
    if missing:
        raise ValueError(f"readings lack {sorted(missing)}; need 'GEMV' and 'GEMM', got {sorted(readings)}")
    v, g = readings["GEMV"], readings["GEMM"]
    ev = {"GEMV compute": (100 * v.compute_util, "%"), "GEMV bandwidth": (100 * v.bandwidth_util, "%"),
          "GEMM compute": (100 * g.compute_util, "%"), "GEMM bandwidth": (100 * g.bandwidth_util, "%"),
          "counters": (v.source.split(":")[0], "")}
    problems = []
    if not _signature(v):
        problems.append(f"the memory-bound GEMV read {100 * v.compute_util:.0f}% compute and "
                        f"{100 * v.bandwidth_util:.0f}% bandwidth: not the signature")
    if _signature(g):
        problems.append(f"the compute-bound GEMM shows the same signature ({100 * g.compute_util:.0f}% compute, "
                        f"{100 * g.bandwidth_util:.0f}% bandwidth): it does not tell them apart")
    return settle(prediction, problems,
                  why_holds=f"counters: GEMV {100 * v.compute_util:.0f}% compute / {100 * v.bandwidth_util:.0f}% "
                            f"bandwidth, GEMM {100 * g.compute_util:.0f}% / {100 * g.bandwidth_util:.0f}%",
                  evidence=ev, tolerance=tol)


def measure_c5(device: Any, roof: Any, gemm: Mapping[str, int], gemv: Mapping[str, int], dtype: str,
               seconds: float) -> dict[str, CounterReading] | str:
    """Counter readings while each kernel loops ~`seconds` s, or why there are none."""
    import torch

    try:
        counters.probe(device)
        out = {}
        for name, shape in (("GEMV", gemv), ("GEMM", gemm)):
            with torch.inference_mode():
                fn = zoo.get("gemm").build(dtype, device, **shape)
                out[name] = counters.read(fn, seconds, device, roof.peak(dtype), roof.bandwidth)
        return out
    except counters.CountersUnavailable as exc:
        return str(exc)


def run_c5(size: str = "smoke", device: Any = None) -> Verdict:
    """C5 end to end: ceilings and prediction, then the counters (inconclusive where there are none)."""
    dev = _device.pick(device or "auto")
    P, dtype = _sizes(size, dev), bench.default_dtype(dev)
    roof = phases.measure_roofline(dev, dtype)
    gemm = {"m": P["zoo_gemm"], "n": P["zoo_gemm"], "k": P["zoo_gemm"]}
    gemv = gemv_shape(dev, dtype, P)
    pred = predict_c5(roof, gemm, gemv, dtype)
    return judge_c5(pred, measure_c5(dev, roof, gemm, gemv, dtype, P["telemetry_s"]))
