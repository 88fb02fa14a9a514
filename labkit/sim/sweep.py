"""Simulated load sweeps (C20): one summary row per offered rate. Their knee is read with
`labkit.knee` (`last_inside`: the last rate still inside the latency bound and keeping up;
`first_past`: the first rate past it), the same functions that read a live server's sweep.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from labkit.sim import metrics
from labkit.sim.cost import CostModel
from labkit.sim.engine import simulate
from labkit.sim.kv import KVMemory
from labkit.scheduling import Policy
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
