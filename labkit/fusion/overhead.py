"""Where do the milliseconds go in a model of many tiny ops? (claim C6)

Prediction: time ≈ ops x per-op overhead, when each op's own work is negligible.
The per-op overhead comes from `labkit.bench.dispatch_overhead` (a burst of one-element
eager adds); the op count from the profiler (`labkit.fusion.count.count_ops`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from labkit.bench.suites import dispatch_overhead
from labkit.timing import measure


class TinyOps(nn.Module):
    """`n_ops` elementwise ops on a tiny tensor: almost no work, all overhead.

    Cycles through mul, add, sin (cheap, shape-preserving) so nothing is optimised away.
    """

    def __init__(self, n_ops: int = 1000, width: int = 16):
        super().__init__()
        if n_ops < 1 or width < 1:
            raise ValueError(f"n_ops and width must be >= 1, got n_ops={n_ops}, width={width}")
        self.n_ops = n_ops
        self.scale = nn.Parameter(torch.full((width,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.n_ops):
            k = i % 3
            x = x * self.scale if k == 0 else (x + 1.0 if k == 1 else torch.sin(x))
        return x


def per_op_cost_s(device: torch.device | str = "cpu", width: int = 16, ops: int = 300) -> float:
    """Seconds one tiny eager op of `TinyOps`'s kinds costs on `device`, measured on its own.

    A burst of `ops` calls of each kind (mul by a tensor, add a Python scalar, sin) on a
    `width`-element tensor, fresh outputs as in the model, under inference_mode; the mean
    over the kinds, each the fastest of 5 bursts (on a shared machine the least disturbed one;
    time the model the same way). Unlike `per_op_overhead_s` (a one-element add into a preallocated
    output, the dispatcher's floor) this includes the allocation and scalar wrapping the
    model's ops pay, so it is the cost C6's prediction multiplies by the op count.
    """
    if width < 1 or ops < 1:
        raise ValueError(f"width and ops must be >= 1, got width={width}, ops={ops}")
    dev = torch.device(device)
    x, s = torch.ones(width, device=dev), torch.full((width,), 0.5, device=dev)
    kinds = (lambda: x * s, lambda: x + 1.0, lambda: torch.sin(x))
    per_kind = []
    with torch.inference_mode():
        for op in kinds:
            def burst(op=op) -> None:
                for _ in range(ops):
                    op()
            per_kind.append(measure(burst, warmup=1, repeat=5, device=dev).min / ops)
    return sum(per_kind) / len(per_kind)


def per_op_overhead_s(device: torch.device | str = "cpu", ops: int = 1000) -> float:
    """Seconds one tiny eager op costs on `device`, from `labkit.bench.dispatch_overhead`."""
    return dispatch_overhead(torch.device(device), ops=ops).time_s / ops


@dataclasses.dataclass
class OverheadShare:
    """Predicted overhead (ops x per-op cost) against a measured time, both in seconds."""

    ops: int
    per_op_s: float
    measured_s: float

    @property
    def predicted_s(self) -> float:
        return self.ops * self.per_op_s

    @property
    def share(self) -> float:
        """Fraction of the measured time the per-op overhead accounts for (capped at 1)."""
        return min(self.predicted_s / self.measured_s, 1.0)
