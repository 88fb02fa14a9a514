"""Load sweeps and the knee of the throughput–latency curve (C20).

Knee (our definition): the highest offered rate at which the server still keeps up
(throughput ≥ `keep_up` × offered rate; 0.9 leaves room for the drain at the end of a finite run) and the p99 E2E latency is at most `factor` ×
its value at the lightest load. Past it, more offered load buys little throughput and a
lot of latency. Capacity = the throughput measured at the knee.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from labkit.sim import metrics
from labkit.sim.cost import CostModel
from labkit.sim.engine import simulate
from labkit.sim.kv import KVMemory
from labkit.sim.schedulers import Policy
from labkit.sim.workload import Workload


def load_sweep(rates: Sequence[float], workload: Callable[[float], Workload], policy: Callable[[], Policy],
               cost: CostModel, kv: Callable[[], KVMemory] | None = None) -> list[dict[str, Any]]:
    """Simulate each offered `rate` (requests/s) with a fresh policy and KV cache; one summary
    dict per rate, with "rate" added."""
    if not rates or min(rates) <= 0:
        raise ValueError(f"rates must be a non-empty list of values > 0 requests/s, got {rates!r}")
    rows = []
    for rate in sorted(rates):
        res = simulate(workload(rate), policy(), cost, kv() if kv else None)
        rows.append({"rate": rate, **metrics.summary(res)})
    return rows


def knee(rows: Sequence[dict[str, Any]], factor: float = 2.0, keep_up: float = 0.9,
         metric: str = "e2e", q: str = "p99") -> dict[str, Any] | None:
    """The sweep row at the knee (see module doc), or None if even the lightest load fails."""
    if factor <= 1 or not 0 < keep_up <= 1:
        raise ValueError(f"need factor > 1 and 0 < keep_up <= 1, got {factor}, {keep_up}")
    rows = sorted(rows, key=lambda r: r["rate"])
    base = rows[0][metric][q]
    best = None
    for r in rows:
        if r["throughput_rps"] >= keep_up * r["rate"] and r[metric][q] <= factor * base:
            best = r
        else:
            break
    return best


def first_past(rows: Sequence[dict[str, Any]], axis: str = "rate", factor: float = 2.0, metric: str = "e2e",
               q: str = "p99") -> dict[str, Any] | None:
    """The knee as the ledger locates it (C20): the first level, in increasing `axis` order,
    whose `q` `metric` latency (s) exceeds `factor` x its value at the lightest level.

    Unlike `knee` (the last level still inside the bound), this row sits past the bend, where
    the server has run out of room: its throughput is what the sweep found as capacity, so
    the claim can be checked against the throughput curve rather than by the definition.
    None when no level in the sweep exceeds the bound (no knee in range)."""
    if factor <= 1:
        raise ValueError(f"need factor > 1, got {factor}")
    if not rows:
        raise ValueError("need at least one sweep row")
    rows = sorted(rows, key=lambda r: r[axis])
    base = rows[0][metric][q]
    return next((r for r in rows[1:] if r[metric][q] > factor * base), None)
