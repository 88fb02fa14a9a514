"""The machine's speed during a run, read from the engine's step trace against the per-step model.

A per-step model (`labkit.sim.stepcost.StepCost`) prices a step from a grid measured on the
engine alone. On a shared VM the same step can cost 20-30 % more or less a minute later, and at
overload a few % of step cost moves the latency tails by tens of %. So beside the twin at the
profile's speed we measure how fast the machine ran the steps of each run: the engine's own model
time of every step it ran (`labkit.serve.steptrace`) over what the model prices that very step at
(same prompt chunks, same decoders' contexts), per window of wall time. No latency enters it: it
is the machine's speed, which the twin can then replay as it replays the arrivals.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from labkit.serve.steptrace import Step
from labkit.sim.stepcost import StepCost


def priced(steps: Sequence[Step], cost: StepCost) -> np.ndarray:
    """The model time (s) `cost`'s profile gives each of `steps` (no engine overhead, no serving
    factor): prompt chunks laid out as the engine runs them, decoders read in its groups, and the
    wake-up cost of a step that started after the engine idled (since the previous step ended)."""
    bare = dataclasses.replace(cost, overhead_s=0.0, overhead_per_row_s=0.0, serving_factor=1.0)
    out = np.empty(len(steps))
    for i, s in enumerate(steps):
        read, extra = bare.decode_read(s.contexts) if s.contexts else (0, 0.0)
        if s.chunks:
            out[i] = bare.plan_time(len(s.contexts), s.chunks, read + sum(s.chunks)) + extra
        else:
            out[i] = bare.step_time(len(s.contexts), 0, read) + extra
        if i:
            out[i] += bare.after_idle(s.t - steps[i - 1].t - steps[i - 1].step_s)
    return out


@dataclasses.dataclass(frozen=True)
class MeasuredSpeed:
    """The engine's model time over the profile's price for the same steps, per window of
    `window_s` s from `t0` (time.monotonic() s of the twin's time 0); `overall` over the run.
    Called with the twin's time t (s), it returns the factor of the window t falls in (the
    nearest one before the first or after the last)."""

    t0: float
    window_s: float
    factors: tuple[float, ...]
    overall: float

    def __call__(self, t: float) -> float:
        if not self.factors:
            return self.overall
        return self.factors[min(max(int(t // self.window_s), 0), len(self.factors) - 1)]


def measure_speed(steps: Sequence[Step], cost: StepCost, t0: float, window_s: float = 1.0,
                  min_steps: int = 20) -> MeasuredSpeed:
    """The machine's speed over `steps` (a run's part of the step trace) against `cost`'s profile,
    windows of `window_s` s from `t0`; a window with fewer than `min_steps` steps takes the run's
    overall factor (too few steps to say)."""
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0 s, got {window_s!r}")
    if not steps:
        raise ValueError("no steps to measure the speed on (was the server started with a step trace?)")
    price = priced(steps, cost)
    real = np.array([s.model_s for s in steps])
    overall = float(real.sum() / price.sum())
    idx = np.maximum(((np.array([s.t for s in steps]) - t0) // window_s).astype(int), 0)
    factors = []
    for k in range(int(idx.max()) + 1):
        m = idx == k
        factors.append(float(real[m].sum() / price[m].sum()) if m.sum() >= min_steps else overall)
    return MeasuredSpeed(t0, window_s, tuple(factors), overall)


BANDS = ((1, 1), (2, 4), (5, 8), (9, math.inf))  # decoders per decode-only step


def model_errors(steps: Sequence[Step], cost: StepCost) -> dict[str, dict[str, Any]]:
    """The profile's price over the engine's model time, minus 1, on the steps the engine ran:
    for the steps with prompt chunks and for decode-only steps by decoders (BANDS); each
    {"steps": n, "error": price / real - 1 (NaN if none)}."""
    price, real = priced(steps, cost), np.array([s.model_s for s in steps])
    decoders = np.array([len(s.contexts) for s in steps])
    prompt = np.array([bool(s.chunks) for s in steps], dtype=bool)
    groups = {"prompt steps": prompt}
    for lo, hi in BANDS:
        name = f"decode {lo}" if lo == hi else (f"decode {lo}-{hi}" if hi != math.inf else f"decode {lo}+")
        groups[name] = ~prompt & (decoders >= lo) & (decoders <= hi)
    return {k: {"steps": int(m.sum()), "error": float(price[m].sum() / real[m].sum() - 1) if m.any() else math.nan}
            for k, m in groups.items()}


def format_model_errors(rows: dict[str, dict[str, dict[str, Any]]], speeds: dict[str, MeasuredSpeed]) -> str:
    """Per load level: the machine's speed over the run (its windows' range) and the profile's
    error on the steps the engine ran, by kind."""
    kinds = list(next(iter(rows.values())))
    lines = [f"{'load':<12}{'speed':>7}{'windows':>12}" + "".join(f"{k:>18}" for k in kinds)]
    for lv, errs in rows.items():
        sp = speeds[lv]
        lo, hi = (min(sp.factors), max(sp.factors)) if sp.factors else (sp.overall, sp.overall)
        lines.append(f"{lv:<12}{sp.overall:>7.2f}{f'{lo:.2f}-{hi:.2f}':>12}"
                     + "".join(f"{100 * e['error']:>+10.0f}% ({e['steps']:>5})" if e["steps"] else f"{'-':>18}"
                               for e in errs.values()))
    lines.append("(speed: the engine's model time over the profile's price for the same steps, < 1: faster than "
                 "profiled; then the profile's error on those steps, (steps))")
    return "\n".join(lines)
