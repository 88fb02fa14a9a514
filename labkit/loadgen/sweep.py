"""Load sweeps against a live server and their knee (C20).

A sweep runs one bounded load test per level, either closed loop over concurrency (users)
or open loop over offered rate (requests/s), and returns one `summarize` row per level with
"level" (as asked) and "concurrency" or "rate" (the rate the plan really offered) added.
The knee is judged like the simulator's (`labkit.knee`):

* over **rate** (`labkit.knee.last_inside`, as the simulator's): the highest offered rate at which
  throughput is still ≥ `keep_up` × offered and p99 E2E ≤ `factor` × its lightest-load value;
* over **concurrency**: a closed loop always "keeps up" (it only sends when answered), so
  only the latency half applies: the highest concurrency whose p99 E2E is ≤ `factor` × the
  lowest concurrency's, with throughput still rising up to it. Capacity = throughput there.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from labkit.loadgen.arrivals import RequestSpec
from labkit.loadgen.client import Target, run_load
from labkit.loadgen.summary import SLO
from labkit.knee import last_inside

AXES = ("concurrency", "rate")


def run_sweep(target: Target | str, axis: str, levels: Sequence[float],
              specs: Callable[[float], Sequence[RequestSpec]], *, max_duration_s: float = 30.0,
              warmup: int = 0, slo: SLO | None = None, progress: Callable[[str], None] | None = None,
              **run_kw: Any) -> list[dict[str, Any]]:
    """One load test per level (ascending); `specs(level)` builds that level's requests
    (open-loop specs with send times for axis "rate"). Rows: summary + the level."""
    if axis not in AXES:
        raise ValueError(f"sweep axis {axis!r} unknown; choose one of {', '.join(AXES)}")
    if not levels or min(levels) <= 0:
        raise ValueError(f"levels must be a non-empty list of values > 0, got {levels!r}")
    rows = []
    for level in sorted(levels):
        users = int(level) if axis == "concurrency" else None
        plan = list(specs(level))
        res = run_load(target, plan, users=users, max_duration_s=max_duration_s, warmup=warmup, **run_kw)
        row = {"level": level, axis: level if axis == "concurrency" else offered_rate(plan), **res.summary(slo)}
        rows.append(row)
        if progress:
            progress(f"{axis} {level:g}: {row['throughput_rps']:.2f} req/s, p99 E2E {row['e2e']['p99']:.3f} s, "
                     f"completed {row['completed']}/{row['requests']}")
    return rows


def offered_rate(specs: Sequence[RequestSpec]) -> float:
    """The rate (requests/s) a finite open-loop plan really offers: (n − 1) / its span, which
    differs from the nominal rate by the arrival process's randomness."""
    at = [s.at_s for s in specs if s.at_s is not None]
    return (len(at) - 1) / (at[-1] - at[0]) if len(at) > 1 and at[-1] > at[0] else float("inf")


def knee(rows: Sequence[dict[str, Any]], axis: str = "concurrency", factor: float = 2.0, keep_up: float = 0.9,
         metric: str = "e2e", q: str = "p99") -> dict[str, Any] | None:
    """The sweep row at the knee (see module doc: `labkit.knee.last_inside`), or None if even the
    lightest level fails."""
    if axis not in AXES:
        raise ValueError(f"sweep axis {axis!r} unknown; choose one of {', '.join(AXES)}")
    return last_inside(rows, axis, factor, keep_up, metric, q)
