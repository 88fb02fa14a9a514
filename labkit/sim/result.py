"""What a simulation returns: per-request times and a per-step timeline (numpy arrays)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from labkit.sim.workload import Workload


@dataclasses.dataclass
class Result:
    """Per request (index = request id): t_sched (first admitted), t_first (first token),
    t_done (last token), all in s, NaN if never reached; preemptions; rejected {id: reason}.
    timeline: per step t (end, s), dt (s), decode (seqs), prefill (tokens), chunks (prompts
    it ran), batch (running seqs), kv_blocks (in use), kv_tokens (stored). extra_itl: token gaps (s) across a
    preemption. kv_unit: tokens per KV block; kv_total: blocks."""

    workload: Workload
    policy: str
    cost: str
    t_sched: np.ndarray
    t_first: np.ndarray
    t_done: np.ndarray
    preemptions: np.ndarray
    rejected: dict[int, str]
    timeline: dict[str, np.ndarray]
    extra_itl: np.ndarray
    kv_unit: int
    kv_total: int
    kv_reserve: str

    @classmethod
    def build(cls, srv: Any) -> "Result":
        return cls(srv.w, getattr(srv.policy, "name", type(srv.policy).__name__), getattr(srv.cost, "name", ""),
                   srv.t_sched, srv.t_first, srv.t_done, srv.preemptions, dict(srv.rejected),
                   {k: np.frombuffer(v, dtype=float if v.typecode == "d" else np.int64).copy()
                    for k, v in srv.tl.items()},
                   np.asarray(srv.extra_itl, dtype=float), srv.kv.unit, srv.kv.total, srv.kv.reserve)

    @property
    def done(self) -> np.ndarray:
        """Mask of requests that completed."""
        return ~np.isnan(self.t_done)

    @property
    def n_steps(self) -> int:
        return len(self.timeline["t"])
